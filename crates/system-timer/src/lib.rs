//! The reaper-driven timer (see the system-timer issue).
#![warn(missing_docs)]
