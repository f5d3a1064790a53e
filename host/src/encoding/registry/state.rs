//! Whether the schema registry answers, as the last request to it found: for `/readyz`,
//! `/status` and `sluice_dependency_up{dependency="schema_registry"}`.

use std::sync::Mutex;

use crate::encoding::source::RegistryError;

/// The last answer (or the lack of one) from the registry.
#[derive(Debug, Default)]
pub struct RegistryState {
    last: Mutex<Last>,
}

#[derive(Debug, Default, Clone)]
struct Last {
    /// `None`: not asked yet.
    up: Option<bool>,
    error: Option<String>,
}

impl RegistryState {
    /// Records a request's outcome: any answer but an outage means the registry is up.
    pub fn record<T>(&self, result: &Result<T, RegistryError>) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Err(e) if e.is_outage() => {
                last.up = Some(false);
                last.error = Some(e.to_string());
            }
            _ => {
                last.up = Some(true);
                last.error = None;
            }
        }
    }

    /// Whether the last request got an answer (`true` before the first one: nothing is known
    /// to be wrong).
    pub fn up(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .up
            .unwrap_or(true)
    }

    /// Why the last request got no answer.
    pub fn error(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .error
            .clone()
    }
}
