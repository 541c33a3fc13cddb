// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// Stand-in for Kafka's Exit so that Kafka's files compile without their dependencies; exits as the real one's default.
package org.apache.kafka.common.utils;

public final class Exit {
    private Exit() { }

    public static void exit(int statusCode) {
        System.exit(statusCode);
    }
}
