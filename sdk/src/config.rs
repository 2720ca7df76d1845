//! The operator's configuration for a sink.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::{Result, SinkError};

/// The `config` map the operator wrote for this sink in the pipeline, as
/// passed to [`Sink::open`](crate::Sink::open). Keys and values are strings;
/// when a key appears twice the last value wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config(BTreeMap<String, String>);

impl Config {
    /// Builds a configuration from key/value pairs (for tests).
    pub fn new<K, V>(entries: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        Config(
            entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The value of `key`, if the operator set it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The value of `key`, or [`SinkError::Fatal`] naming the key when the
    /// operator did not set it. Use it in [`Sink::open`](crate::Sink::open)
    /// for settings you cannot do without.
    pub fn require(&self, key: &str) -> Result<&str> {
        self.get(key)
            .ok_or_else(|| SinkError::Fatal(format!("config key `{key}` is required")))
    }

    /// The value of `key` parsed as `T`, or `default` when the key is absent.
    /// A value that does not parse is [`SinkError::Fatal`] naming the key.
    pub fn parse<T>(&self, key: &str, default: T) -> Result<T>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|e| {
                SinkError::Fatal(format!("config key `{key}`: cannot use {raw:?}: {e}"))
            }),
        }
    }

    /// [`SinkError::Fatal`] naming the first key (in sorted order) that is
    /// not one of `known`, and the keys that are: call it first in
    /// [`Sink::open`](crate::Sink::open) so that a misspelt setting stops
    /// the pipeline at start instead of being silently ignored.
    ///
    /// ```
    /// # use weir_sdk::Config;
    /// let config = Config::new([("folder", "out"), ("fromat", "csv")]);
    /// let refused = config.reject_unknown(&["folder", "format"]).unwrap_err();
    /// assert!(refused.to_string().contains("`fromat` is unknown"));
    /// ```
    pub fn reject_unknown(&self, known: &[&str]) -> Result<()> {
        let Some(key) = self.0.keys().find(|key| !known.contains(&key.as_str())) else {
            return Ok(());
        };
        let allowed = if known.is_empty() {
            "none".to_string()
        } else {
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(SinkError::Fatal(format!(
            "config key `{key}` is unknown (known keys: {allowed})"
        )))
    }

    /// Every key and value, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the operator gave no configuration.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Config {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Config::new(iter)
    }
}

impl From<BTreeMap<String, String>> for Config {
    fn from(map: BTreeMap<String, String>) -> Self {
        Config(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_require_parse() {
        let c = Config::new([("a", "1"), ("b", "x"), ("a", "2")]);
        assert_eq!(c.get("a"), Some("2"));
        assert_eq!(c.require("b").unwrap(), "x");
        let e = c.require("nope").unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("`nope`")),
            "{e}"
        );
        assert_eq!(c.parse::<u32>("a", 7).unwrap(), 2);
        assert_eq!(c.parse::<u32>("missing", 7).unwrap(), 7);
        let e = c.parse::<u32>("b", 7).unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("`b`")),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key_and_the_known_ones() {
        let c = Config::new([("folder", "out"), ("fromat", "csv"), ("zz", "1")]);
        assert!(c.reject_unknown(&["folder", "fromat", "zz"]).is_ok());
        let e = c.reject_unknown(&["folder", "format"]).unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m)
                if m.contains("`fromat` is unknown") && m.contains("`folder`, `format`")),
            "{e}"
        );
        let e = c.reject_unknown(&[]).unwrap_err();
        assert!(
            matches!(&e, SinkError::Fatal(m) if m.contains("`folder` is unknown") && m.contains("none")),
            "{e}"
        );
        assert!(Config::default().reject_unknown(&[]).is_ok());
    }
}
