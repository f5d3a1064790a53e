//! Secrets by reference, one type for every credential, and keeping them out of everything
//! Sluice prints.
//!
//! Any string in `sluice.toml` may be, or contain, `${env:NAME}` (an environment variable) or
//! `${file:PATH}` (a file's contents, one trailing newline removed; a relative path is relative
//! to the config file's directory); `$${` is a literal `${`. [`resolve`] replaces them in the
//! parsed TOML tree before the configuration is deserialised and validated, so every key gets
//! them and `config check` checks the real values.
//!
//! What counts as a secret ([`Resolved::secrets`]): every `${file:}` value, every value of a
//! secret-like key (see [`is_secret_key`]) whether written out or referenced, the password
//! of any URL, and every [`Secret`] read from the configuration. Those are [`register`]ed, and
//! [`scrub`] replaces them with `[redacted]` in log lines ([`ScrubbingWriter`]), panic
//! messages ([`install_panic_hook`]) and command output. Errors about a reference name the key
//! and the variable or path, never a value.
//!
//! - `reference`: `${env:…}`/`${file:…}` resolution in the TOML tree
//! - `key`: which key names make a value a secret
//! - `url`: passwords and secret query parameters inside URLs
//! - `scrub`: the registry of secrets, the scrubbing writer, the panic hook
//! - `value`: [`Secret`], the type of every credential field
//!
//! Dependencies run one way: `reference` uses `key` and `url`, `url` uses `key`, `value` uses
//! `scrub`; `scrub` and `key` use none of them.

mod key;
mod reference;
mod scrub;
mod url;
mod value;

pub use key::is_secret_key;
pub use reference::{Environment, MAX_FILE_BYTES, Resolved, Sources, resolve};
pub use scrub::{MIN_SCRUBBED_LEN, REDACTED, ScrubbingWriter, install_panic_hook, register, scrub};
pub use url::{SecretUrl, redact_url, url_password, url_password_range, url_passwords};
pub use value::{Secret, constant_time_eq};
