// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// Stand-in for Kafka's FatalExitError so that Kafka's files compile without their dependencies (nothing here throws it).
package org.apache.kafka.common.internals;

public class FatalExitError extends Error {
    private static final long serialVersionUID = 1L;

    private final int statusCode;

    public FatalExitError(int statusCode) {
        if (statusCode == 0)
            throw new IllegalArgumentException("statusCode must not be 0");
        this.statusCode = statusCode;
    }

    public int statusCode() {
        return statusCode;
    }
}
