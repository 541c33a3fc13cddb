//! Shared by the test files that include it (`mod common;`).

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Runs `f` on its own thread and fails the test if it has not finished within `limit` (a hang
/// guard only: no test relies on how long anything takes).
pub(crate) fn with_timeout<R: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    let body = std::thread::Builder::new()
        .name("test-body".into())
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .unwrap();
    match rx.recv_timeout(limit) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => match body.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(RecvTimeoutError::Timeout) => panic!("hung: not finished after {limit:?}"),
    }
}
