// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// No-op stand-in for SLF4J's LoggerFactory so that Kafka's files compile without their dependencies.
package org.slf4j;

public final class LoggerFactory {
    private static final Logger NOP = new Logger() { };

    private LoggerFactory() { }

    public static Logger getLogger(Class<?> clazz) {
        return NOP;
    }
}
