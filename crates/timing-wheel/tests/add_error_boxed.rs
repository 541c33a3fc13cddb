//! An `AddError` sent up with `?` into the usual boxed error. (Failed to compile while
//! `AddError` had no way to drop its value, as `system_timer::ScheduleError::without_task` and
//! `purgatory::WatchError::without_op` do for theirs.)
#![cfg(not(loom))]

use std::error::Error;

use timing_wheel::{AddError, ConcurrentWheel};

/// A boxed callback: `Send` (all a `ConcurrentWheel` asks of its values), not `Sync`.
type Callback = Box<dyn FnOnce() + Send>;

/// Schedules `f` at `deadline`, passing a refusal on with `?` as an application does, into a
/// `Box<dyn Error + Send + Sync>` (what `anyhow` and most error stacks require).
fn schedule(
    wheel: &ConcurrentWheel<Callback>,
    deadline: u64,
    f: Callback,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    wheel
        .add_keyed(deadline, f)
        .map_err(AddError::without_value)?;
    Ok(())
}

/// The error of a concurrent wheel of boxed callbacks (which are `Send` but not `Sync`) can be
/// sent up with `?` as a `Box<dyn Error + Send + Sync>` once its value is dropped, keeping the
/// variant and its message; a deadline already reached is the refusal tested.
#[test]
fn an_add_error_of_a_value_that_is_not_sync_goes_up_with_the_question_mark() {
    let wheel: ConcurrentWheel<Callback> = ConcurrentWheel::new(1, 20, 100).unwrap();
    assert!(schedule(&wheel, 150, Box::new(|| ())).is_ok());
    let e = schedule(&wheel, 100, Box::new(|| ())).unwrap_err();
    assert_eq!(e.to_string(), "deadline already reached");
    assert!(matches!(
        e.downcast_ref::<AddError<()>>(),
        Some(AddError::Expired(()))
    ));
}
