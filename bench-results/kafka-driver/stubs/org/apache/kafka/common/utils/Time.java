// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// Stand-in for Kafka's Time so that Kafka's files compile without their dependencies; behaves as the real SYSTEM clock.
package org.apache.kafka.common.utils;

import java.util.concurrent.TimeUnit;

public interface Time {
    /** As Kafka's SystemTime: the wall clock and System.nanoTime. */
    Time SYSTEM = new Time() {
        @Override
        public long milliseconds() {
            return System.currentTimeMillis();
        }

        @Override
        public long nanoseconds() {
            return System.nanoTime();
        }
    };

    long milliseconds();

    long nanoseconds();

    /** As Kafka's: nanoseconds() in whole milliseconds. */
    default long hiResClockMs() {
        return TimeUnit.NANOSECONDS.toMillis(nanoseconds());
    }
}
