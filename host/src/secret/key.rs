//! Which config keys hold secrets by their name alone (`sasl.password`, `bearer_token`,
//! `api_key`, …): a value at such a key is a secret even when written out in the file, and a
//! URL's query parameter so named hides its value. Shared by [`super::reference`] and
//! [`super::url`].

/// Words that make a key's value a secret even when written out in the file (checked against
/// the key's last part, lower-cased): `sasl.password`, `ssl.key.password`, `api_key`,
/// `bearer_token`, `sasl.oauthbearer.client.secret`, `ssl.key.pem`, …
const SECRET_KEY_WORDS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "credential",
    "api_key",
    "apikey",
    "api-key",
    "private_key",
    "private-key",
    "ssl.key.pem",
    "sasl.jaas.config",
    "sasl.oauthbearer.config",
];

/// Whether a key's value is a secret even when written out in the file.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEY_WORDS.iter().any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_like_keys_are_known_by_their_name_in_any_case() {
        assert!(is_secret_key("sasl.password"));
        assert!(is_secret_key("ssl.key.password"));
        assert!(is_secret_key("sasl.oauthbearer.client.secret"));
        assert!(is_secret_key("API_KEY"));
        assert!(!is_secret_key("ssl.key.location"));
        assert!(!is_secret_key("bootstrap.servers"));
    }
}
