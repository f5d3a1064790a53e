//! Transitional alias while the plugin layer moves to [`crate::model`].

pub use crate::model::OutboundMessage as Message;
