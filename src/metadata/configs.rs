//! The topic config keys the controller accepts, with Kafka's names and
//! ranges: a value is checked before a ConfigRecord is written; an unknown
//! key or a value out of range is INVALID_CONFIG.

/// Why a config cannot be set (Kafka's INVALID_CONFIG).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("INVALID_CONFIG: {0}")]
pub struct InvalidConfig(pub String);

/// What a key's value must be.
enum Kind {
    /// An integer from `min` to `max`.
    Int {
        min: i64,
        max: i64,
    },
    /// A number from 0 to 1.
    Ratio,
    Bool,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A comma-separated list of these words, at least one.
    ListOf(&'static [&'static str]),
}

const INT_MAX: i64 = i32::MAX as i64;
const LONG_MAX: i64 = i64::MAX;

/// Every topic key this build knows.
const TOPIC_KEYS: [(&str, Kind); 18] = [
    ("cleanup.policy", Kind::ListOf(&["delete", "compact"])),
    (
        "compression.type",
        Kind::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
    ),
    ("delete.retention.ms", Kind::Int { min: 0, max: LONG_MAX }),
    ("file.delete.delay.ms", Kind::Int { min: 0, max: LONG_MAX }),
    ("flush.messages", Kind::Int { min: 1, max: LONG_MAX }),
    ("flush.ms", Kind::Int { min: 0, max: LONG_MAX }),
    ("max.compaction.lag.ms", Kind::Int { min: 1, max: LONG_MAX }),
    ("max.message.bytes", Kind::Int { min: 0, max: INT_MAX }),
    ("message.timestamp.type", Kind::OneOf(&["CreateTime", "LogAppendTime"])),
    ("min.cleanable.dirty.ratio", Kind::Ratio),
    ("min.compaction.lag.ms", Kind::Int { min: 0, max: LONG_MAX }),
    ("min.insync.replicas", Kind::Int { min: 1, max: INT_MAX }),
    ("preallocate", Kind::Bool),
    ("retention.bytes", Kind::Int { min: -1, max: LONG_MAX }),
    ("retention.ms", Kind::Int { min: -1, max: LONG_MAX }),
    ("segment.bytes", Kind::Int { min: 14, max: INT_MAX }),
    ("segment.ms", Kind::Int { min: 1, max: LONG_MAX }),
    ("unclean.leader.election.enable", Kind::Bool),
];

/// Whether `key` is a topic config this build knows (one that may be
/// deleted).
pub fn is_topic_config_key(key: &str) -> bool {
    TOPIC_KEYS.iter().any(|(k, _)| *k == key)
}

/// Whether `value` may be set for the topic config `key`.
pub fn check_topic_config(key: &str, value: &str) -> Result<(), InvalidConfig> {
    let Some((_, kind)) = TOPIC_KEYS.iter().find(|(k, _)| *k == key) else {
        return Err(InvalidConfig(format!("unknown topic config {key:?}")));
    };
    let invalid = |what: String| Err(InvalidConfig(format!("{key} = {value:?}: {what}")));
    match kind {
        Kind::Int { min, max } => match value.trim().parse::<i64>() {
            Ok(n) if (*min..=*max).contains(&n) => Ok(()),
            Ok(_) => invalid(format!("must be from {min} to {max}")),
            Err(_) => invalid("not an integer".into()),
        },
        Kind::Bool => match value.trim() {
            "true" | "false" => Ok(()),
            _ => invalid("must be true or false".into()),
        },
        Kind::Ratio => match value.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => invalid("must be a number from 0 to 1".into()),
        },
        Kind::OneOf(words) => match words.contains(&value.trim()) {
            true => Ok(()),
            false => invalid(format!("must be one of {}", words.join(", "))),
        },
        Kind::ListOf(words) => {
            let items: Vec<&str> = value.split(',').map(str::trim).collect();
            match items.iter().all(|item| words.contains(item)) {
                true => Ok(()),
                false => invalid(format!("must be a list of {}", words.join(", "))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_topic_keys_take_values_in_their_range() {
        for (key, value) in [
            ("cleanup.policy", "delete"),
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "-1"),
            ("retention.ms", "604800000"),
            ("retention.bytes", "1073741824"),
            ("min.insync.replicas", "2"),
            ("segment.bytes", "14"),
            ("compression.type", "zstd"),
            ("unclean.leader.election.enable", "false"),
            ("min.cleanable.dirty.ratio", "0.5"),
        ] {
            assert_eq!(check_topic_config(key, value), Ok(()), "{key} = {value}");
        }
    }

    #[test]
    fn unknown_keys_and_values_out_of_range_are_invalid_config() {
        for (key, value, expected) in [
            ("retention.parsecs", "1", "unknown topic config \"retention.parsecs\""),
            ("cleanup.policy", "forever", "must be a list of delete, compact"),
            ("cleanup.policy", "", "must be a list of"),
            ("retention.ms", "-2", "must be from -1 to"),
            ("retention.ms", "soon", "not an integer"),
            ("min.insync.replicas", "0", "must be from 1 to 2147483647"),
            ("segment.bytes", "13", "must be from 14"),
            ("segment.bytes", "4294967296", "must be from 14 to 2147483647"),
            ("preallocate", "yes", "must be true or false"),
            ("compression.type", "brotli", "must be one of"),
            ("min.cleanable.dirty.ratio", "1.5", "from 0 to 1"),
        ] {
            let error = check_topic_config(key, value).unwrap_err();
            assert!(error.to_string().starts_with("INVALID_CONFIG: "), "{error}");
            assert!(error.to_string().contains(expected), "{error} lacks {expected:?}");
        }
    }
}
