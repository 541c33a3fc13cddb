// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// Stand-in for Kafka's KafkaThread so that Kafka's files compile without their dependencies; behaves as the real one.
package org.apache.kafka.common.utils;

/** As Kafka's: a named thread with the daemon flag given, reporting uncaught exceptions. */
public class KafkaThread extends Thread {
    public static KafkaThread nonDaemon(final String name, Runnable runnable) {
        return new KafkaThread(name, runnable, false);
    }

    @SuppressWarnings("this-escape")
    public KafkaThread(final String name, Runnable runnable, boolean daemon) {
        super(runnable, name);
        setDaemon(daemon);
        setUncaughtExceptionHandler((t, e) -> {
            System.err.println("Uncaught exception in thread '" + name + "':");
            e.printStackTrace();
        });
    }
}
