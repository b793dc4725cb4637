//! Kafka's rules for topic names: what the controller checks before it
//! writes a TopicRecord.

use imbl::OrdMap;
use uuid::Uuid;

/// The longest topic name (Kafka's limit: a partition's directory name
/// adds a dash and the partition number within 255 bytes).
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Why a name cannot be a new topic's (Kafka's INVALID_TOPIC_EXCEPTION).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("INVALID_TOPIC_EXCEPTION: {0}")]
pub struct InvalidTopic(pub String);

/// Whether `name` may be a new topic's beside the topics named in
/// `existing`: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`, and not
/// the name of an existing topic but for `.` and `_` (the two collide in
/// the metric names Kafka's clients build from a topic's name). An
/// existing topic of exactly this name is the caller's
/// TOPIC_ALREADY_EXISTS, not checked here.
pub fn check_new_topic_name(name: &str, existing: &OrdMap<String, Uuid>) -> Result<(), InvalidTopic> {
    if name.is_empty() {
        return Err(InvalidTopic("a topic name may not be empty".into()));
    }
    if name == "." || name == ".." {
        return Err(InvalidTopic(format!("a topic may not be named {name:?}")));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(InvalidTopic(format!(
            "a topic name may have at most {MAX_TOPIC_NAME_LEN} characters, not {}",
            name.len()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidTopic(format!(
            "{name:?} holds {bad:?}: a topic name may hold only ASCII letters, digits, '.', '_' and '-'"
        )));
    }
    if name.contains(['.', '_']) {
        let key = collision_key(name);
        if let Some(other) = existing
            .keys()
            .find(|other| other.as_str() != name && collision_key(other) == key)
        {
            return Err(InvalidTopic(format!(
                "{name:?} collides with the existing topic {other:?} ('.' and '_' are the same in metric names)"
            )));
        }
    }
    Ok(())
}

fn collision_key(name: &str) -> String {
    name.replace('.', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn existing(names: &[&str]) -> OrdMap<String, Uuid> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), Uuid::from_bytes([i as u8; 16])))
            .collect()
    }

    #[test]
    fn kafkas_topic_name_rules() {
        let none = existing(&[]);
        for good in ["orders", "a.b_c-D9", "_", "-", "...", &"x".repeat(MAX_TOPIC_NAME_LEN)] {
            assert_eq!(check_new_topic_name(good, &none), Ok(()), "{good}");
        }
        let long = "x".repeat(MAX_TOPIC_NAME_LEN + 1);
        for (bad, expected) in [
            ("", "may not be empty"),
            (".", "may not be named"),
            ("..", "may not be named"),
            (long.as_str(), "at most 249"),
            ("a b", "' '"),
            ("a/b", "'/'"),
            ("tôpic", "'ô'"),
        ] {
            let error = check_new_topic_name(bad, &none).unwrap_err();
            assert!(error.to_string().starts_with("INVALID_TOPIC_EXCEPTION: "), "{error}");
            assert!(error.to_string().contains(expected), "{error} lacks {expected:?}");
        }
    }

    #[test]
    fn dots_and_underscores_collide_with_an_existing_topic() {
        let topics = existing(&["metrics.cpu", "plain"]);
        let error = check_new_topic_name("metrics_cpu", &topics).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("collides with the existing topic \"metrics.cpu\""),
            "{error}"
        );
        assert!(check_new_topic_name("metrics.mem", &topics).is_ok());
        // The same name is not a collision (the caller answers TOPIC_ALREADY_EXISTS).
        assert!(check_new_topic_name("metrics.cpu", &topics).is_ok());
        assert!(check_new_topic_name("pl_ain", &topics).is_ok());
    }
}
