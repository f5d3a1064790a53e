//! Background services beside the relay loop. Each has the same shape: an async `run` that
//! works until its [`crate::shutdown::Shutdown`] fires and then returns; the app starts them
//! and joins them at exit.
//!
//! - [`pruner`]: deletes sent rows past `relay.retention` (`mark = "published_at"`)
//! - [`wakeups`]: LISTEN/NOTIFY, which cuts an idle relay's wait short

pub(crate) mod pruner;
pub(crate) mod wakeups;
