//! The registry of secrets, and keeping them out of everything Sluice prints: [`register`]
//! adds values (in every form they can be written in), [`scrub`] replaces them with
//! [`REDACTED`] in any text, [`ScrubbingWriter`] does so for log lines and
//! [`install_panic_hook`] for panic messages.

use std::borrow::Cow;
use std::io;
use std::sync::{PoisonError, RwLock};

/// What a secret is replaced with wherever Sluice prints text.
pub const REDACTED: &str = "[redacted]";
/// Secrets shorter than this are not scrubbed from free text: replacing every occurrence of
/// two or three characters would garble logs without protecting anything (such a secret can
/// be guessed). They are still never printed as a value of their key.
pub const MIN_SCRUBBED_LEN: usize = 4;

/// The secrets every output is scrubbed of, in every form they can appear in.
static REGISTRY: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds `secrets` to what [`scrub`] removes (also their JSON-, debug- and percent-decoded
/// forms). Secrets stay registered for the life of the process: a rotated-out password is
/// still a password.
pub fn register<I, S>(secrets: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    for secret in secrets {
        let secret = secret.as_ref();
        for form in forms(secret) {
            if form.chars().count() >= MIN_SCRUBBED_LEN && !registry.contains(&form) {
                registry.push(form);
            }
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    registry.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// The ways a secret can be written: as is, escaped in a JSON string or a Rust debug string,
/// and percent-decoded (a URL password written encoded).
fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_owned()];
    if let Ok(json) = serde_json::to_string(secret) {
        forms.push(json[1..json.len() - 1].to_owned());
    }
    let debug = format!("{secret:?}");
    forms.push(debug[1..debug.len() - 1].to_owned());
    if let Ok(decoded) = percent_encoding::percent_decode_str(secret).decode_utf8() {
        forms.push(decoded.into_owned());
    }
    forms.sort();
    forms.dedup();
    forms
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    let mut text = Cow::Borrowed(text);
    for secret in registry.iter() {
        if text.contains(secret.as_str()) {
            text = Cow::Owned(text.replace(secret.as_str(), REDACTED));
        }
    }
    text
}

/// A writer that scrubs what passes through it of registered secrets: log lines, whoever
/// wrote them (Sluice, librdkafka's log and error callbacks, a plugin's `log`). The log
/// formatter writes one whole event per `write`, so a secret is never split across calls.
pub struct ScrubbingWriter<W>(pub W);

impl<W: io::Write> io::Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(scrub(text).as_bytes())?,
            Err(_) => self
                .0
                .write_all(scrub(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Prints panics as the default hook does, scrubbed of registered secrets (a panic message
/// may quote any value).
pub fn install_panic_hook() {
    panic_hook_to(|text| eprintln!("{text}"));
}

/// Installs a panic hook that hands the scrubbed report to `write`.
fn panic_hook_to(write: impl Fn(&str) + Send + Sync + 'static) {
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let backtrace = std::backtrace::Backtrace::capture();
        let text = match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => {
                format!("thread '{name}' {info}\nstack backtrace:\n{backtrace}")
            }
            _ => format!(
                "thread '{name}' {info}\nnote: run with `RUST_BACKTRACE=1` environment \
                 variable to display a backtrace"
            ),
        };
        write(&scrub(&text));
    }));
}
#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn panic_messages_are_scrubbed() {
        static REPORTED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
        register(["Panic-Secret-9"]);
        panic_hook_to(|text| REPORTED.lock().unwrap().push_str(text));
        let caught = std::panic::catch_unwind(|| panic!("bad value Panic-Secret-9 in key"));
        let _ = std::panic::take_hook();
        assert!(caught.is_err());
        let reported = REPORTED.lock().unwrap().clone();
        assert!(
            reported.contains("bad value [redacted] in key")
                && !reported.contains("Panic-Secret-9"),
            "{reported}"
        );
    }

    #[test]
    fn scrubbing_removes_every_form_of_a_registered_secret() {
        register(["Sc\"rub-Me-7", "ab", "p%40ss-Word-8"]);
        let scrubbed = scrub(r#"a Sc"rub-Me-7 b Sc\"rub-Me-7 c p%40ss-Word-8 d p@ss-Word-8 ab"#);
        assert_eq!(
            scrubbed, "a [redacted] b [redacted] c [redacted] d [redacted] ab",
            "short secrets are not scrubbed from free text"
        );
        let mut out = Vec::new();
        ScrubbingWriter(&mut out)
            .write_all(b"{\"fields\":{\"message\":\"Sc\\\"rub-Me-7\"}}\n")
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"fields\":{\"message\":\"[redacted]\"}}\n"
        );
    }
}
