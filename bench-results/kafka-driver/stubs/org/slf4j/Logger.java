// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// No-op stand-in for SLF4J's Logger so that Kafka's files compile without their dependencies (error goes to stderr).
package org.slf4j;

public interface Logger {
    default void trace(String msg) { }

    default void debug(String msg) { }

    default void debug(String format, Object arg) { }

    default void debug(String format, Object... args) { }

    default void info(String msg) { }

    default void error(String msg, Throwable t) {
        System.err.println("ERROR " + msg);
        if (t != null) t.printStackTrace();
    }
}
