//! `config.toml` loading: defaults, validation errors that name their key,
//! unknown keys, command-line overrides, and the files shipped in the repo.

use std::path::{Path, PathBuf};

use kraft::config::{parse_override, Config, ConfigError, NodeRole};

fn overrides(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn repo_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// Parses `text` and expects an `Invalid` error about `key`; returns the message.
fn invalid(text: &str, key: &str) -> String {
    let err = Config::from_toml_str(text, &[]).expect_err(&format!("{text:?} must be refused"));
    assert_eq!(err.key(), Some(key), "wrong key in error for {text:?}: {err}");
    let message = err.to_string();
    assert!(message.contains(key), "message does not name {key}: {message}");
    assert!(
        message.contains("expected"),
        "message does not say what was expected: {message}"
    );
    message
}

#[test]
fn empty_file_gives_the_documented_defaults() {
    let config = Config::from_toml_str("", &[]).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.node.id, 1);
    assert_eq!(config.node.roles, vec![NodeRole::Controller]);
    assert_eq!(config.node.data_dir, PathBuf::from("./data/node-1"));
    assert_eq!(config.node.cluster_id, "kraft-local");
    assert_eq!(config.listeners.raft.to_string(), "127.0.0.1:9093");
    assert_eq!(config.listeners.http.to_string(), "127.0.0.1:8080");
    assert_eq!(config.listeners.max_frame_bytes, 16_777_216);
    assert_eq!(config.listeners.http_workers, 0);
    assert_eq!(config.quorum.voters.len(), 1);
    assert_eq!(config.quorum.voters[&1], "127.0.0.1:9093");
    assert_eq!(config.quorum.election_timeout_ms, 1000);
    assert_eq!(config.quorum.fetch_timeout_ms, 2000);
    assert_eq!(config.quorum.retry_backoff_ms, 20);
    assert_eq!(config.quorum.request_timeout_ms, 2000);
    assert_eq!(config.quorum.election_backoff_max_ms, 1000);
    assert_eq!(config.quorum.append_linger_ms, 0);
    assert_eq!(config.metadata.max_idle_interval_ms, 500);
    assert_eq!(config.broker.heartbeat_interval_ms, 2000);
    assert_eq!(config.broker.session_timeout_ms, 9000);
    assert_eq!(config.log.max_batch_bytes, 8 * 1024 * 1024);
    assert_eq!(config.log.retention_bytes, 100 * 1024 * 1024);
    assert_eq!(config.log.retention_ms, 7 * 24 * 3600 * 1000);
    assert_eq!(config.log.cleaner_interval_ms, 60_000);
    assert_eq!(config.snapshot.max_bytes_between, 20 * 1024 * 1024);
    assert_eq!(config.snapshot.max_interval_ms, 3_600_000);
    assert!(config.is_controller());
    assert!(!config.is_broker());
}

#[test]
fn repo_config_toml_is_the_default() {
    let config = Config::load(&repo_file("config.toml"), &[]).unwrap();
    assert_eq!(config, Config::default());
}

#[test]
fn example_cluster_files_load_and_agree() {
    let configs: Vec<Config> = (1..=3)
        .map(|n| {
            Config::load(&repo_file(&format!("examples/node{n}.toml")), &[])
                .unwrap_or_else(|e| panic!("examples/node{n}.toml: {e}"))
        })
        .collect();
    for (i, config) in configs.iter().enumerate() {
        let n = i as i32 + 1;
        assert_eq!(config.node.id, n);
        assert_eq!(config.listeners.raft.port(), 9092 + n as u16);
        assert_eq!(config.listeners.http.port(), 8079 + n as u16);
        assert_eq!(config.node.data_dir, PathBuf::from(format!("./data/node-{n}")));
        assert_eq!(config.quorum.voters.len(), 3);
        assert_eq!(config.quorum.voters[&n], config.listeners.raft.to_string());
        assert_eq!(config.node.cluster_id, configs[0].node.cluster_id);
        assert_eq!(config.quorum.voters, configs[0].quorum.voters);
    }
}

#[test]
fn partial_file_keeps_defaults_for_missing_keys() {
    let config = Config::from_toml_str("[quorum]\nelection_timeout_ms = 300\n", &[]).unwrap();
    assert_eq!(config.quorum.election_timeout_ms, 300);
    assert_eq!(config.quorum.fetch_timeout_ms, 2000);
    assert_eq!(config.node, Config::default().node);
}

#[test]
fn the_example_error_message_reads_as_documented() {
    let message = invalid("[quorum]\nelection_timeout_ms = -5\n", "quorum.election_timeout_ms");
    assert_eq!(
        message,
        "config.toml: quorum.election_timeout_ms = -5: expected a positive integer (milliseconds)"
    );
}

#[test]
fn every_bad_value_names_its_key() {
    let cases: &[(&str, &str)] = &[
        ("[node]\nid = -1", "node.id"),
        ("[node]\nid = \"one\"", "node.id"),
        ("[node]\nid = 3000000000", "node.id"),
        ("[node]\nroles = []", "node.roles"),
        ("[node]\nroles = [\"leader\"]", "node.roles"),
        ("[node]\nroles = [\"controller\", \"controller\"]", "node.roles"),
        ("[node]\nroles = 5", "node.roles"),
        ("[node]\ndata_dir = \"\"", "node.data_dir"),
        ("[node]\ndata_dir = 7", "node.data_dir"),
        ("[node]\ncluster_id = \"\"", "node.cluster_id"),
        ("[node]\ncluster_id = \"has space\"", "node.cluster_id"),
        ("[node]\ncluster_id = \"slash/no\"", "node.cluster_id"),
        ("[listeners]\nraft = \"localhost\"", "listeners.raft"),
        ("[listeners]\nraft = 9093", "listeners.raft"),
        ("[listeners]\nhttp = \"127.0.0.1:99999\"", "listeners.http"),
        ("[listeners]\nmax_frame_bytes = 0", "listeners.max_frame_bytes"),
        ("[listeners]\nmax_frame_bytes = 1024", "listeners.max_frame_bytes"),
        ("[listeners]\nmax_frame_bytes = 5000000000", "listeners.max_frame_bytes"),
        ("[listeners]\nhttp_workers = -1", "listeners.http_workers"),
        ("[listeners]\nhttp_workers = 65", "listeners.http_workers"),
        ("[listeners]\nhttp_workers = \"two\"", "listeners.http_workers"),
        ("[quorum]\nvoters = []", "quorum.voters"),
        ("[quorum]\nvoters = [\"1-127.0.0.1:9093\"]", "quorum.voters"),
        ("[quorum]\nvoters = [\"x@127.0.0.1:9093\"]", "quorum.voters"),
        ("[quorum]\nvoters = [\"-1@127.0.0.1:9093\"]", "quorum.voters"),
        ("[quorum]\nvoters = [\"1@127.0.0.1\"]", "quorum.voters"),
        ("[quorum]\nvoters = [\"1@127.0.0.1:0\"]", "quorum.voters"),
        ("[quorum]\nvoters = [\"1@:9093\"]", "quorum.voters"),
        (
            "[quorum]\nvoters = [\"1@127.0.0.1:9093\", \"1@127.0.0.1:9094\"]",
            "quorum.voters",
        ),
        (
            "[quorum]\nvoters = [\"1@127.0.0.1:9093\", \"2@127.0.0.1:9093\"]",
            "quorum.voters",
        ),
        ("[quorum]\nvoters = [1]", "quorum.voters"),
        ("[quorum]\nelection_timeout_ms = 0", "quorum.election_timeout_ms"),
        ("[quorum]\nelection_timeout_ms = 1.5", "quorum.election_timeout_ms"),
        ("[quorum]\nelection_timeout_ms = \"1000\"", "quorum.election_timeout_ms"),
        (
            "[quorum]\nelection_timeout_ms = 9223372036854775807",
            "quorum.election_timeout_ms",
        ),
        ("[quorum]\nfetch_timeout_ms = 0", "quorum.fetch_timeout_ms"),
        ("[quorum]\nretry_backoff_ms = -1", "quorum.retry_backoff_ms"),
        ("[quorum]\nrequest_timeout_ms = 0", "quorum.request_timeout_ms"),
        ("[quorum]\nrequest_timeout_ms = 9", "quorum.request_timeout_ms"),
        (
            "[quorum]\nelection_backoff_max_ms = 0",
            "quorum.election_backoff_max_ms",
        ),
        ("[quorum]\nappend_linger_ms = -1", "quorum.append_linger_ms"),
        ("[metadata]\nmax_idle_interval_ms = 0", "metadata.max_idle_interval_ms"),
        ("[broker]\nheartbeat_interval_ms = 0", "broker.heartbeat_interval_ms"),
        ("[broker]\nsession_timeout_ms = 0", "broker.session_timeout_ms"),
        ("[broker]\nsession_timeout_ms = 1000", "broker.session_timeout_ms"),
        ("[broker]\nheartbeat_interval_ms = 9000", "broker.heartbeat_interval_ms"),
        ("[log]\nmax_batch_bytes = 0", "log.max_batch_bytes"),
        ("[log]\nmax_batch_bytes = 8388609", "log.max_batch_bytes"),
        ("[log]\nretention_bytes = 0", "log.retention_bytes"),
        ("[log]\nretention_ms = 0", "log.retention_ms"),
        ("[log]\ncleaner_interval_ms = 0", "log.cleaner_interval_ms"),
        ("[snapshot]\nmax_bytes_between = 0", "snapshot.max_bytes_between"),
        ("[snapshot]\nmax_interval_ms = 0", "snapshot.max_interval_ms"),
        ("node = 5", "node"),
    ];
    for (text, key) in cases {
        invalid(text, key);
    }
}

#[test]
fn the_request_timeout_leaves_a_parked_fetch_time_to_wait() {
    // Half the request timeout is how long a parked fetch waits; at 1 ms
    // that half would be 0 and an idle follower would fetch in a busy loop.
    let message = invalid("[quorum]\nrequest_timeout_ms = 1", "quorum.request_timeout_ms");
    assert!(message.contains("at least 10"), "{message}");
    let config = Config::from_toml_str("[quorum]\nrequest_timeout_ms = 10", &[]).unwrap();
    assert_eq!(config.raft_config().fetch_max_wait_ms, 5);
}

#[test]
fn error_shows_the_value_given() {
    let message = invalid("[quorum]\nvoters = [\"1@127.0.0.1\"]", "quorum.voters");
    assert!(message.contains("[\"1@127.0.0.1\"]"), "{message}");
    assert!(message.contains("id@host:port"), "{message}");
    let message = invalid("[node]\ncluster_id = \"a b\"", "node.cluster_id");
    assert!(message.contains("\"a b\""), "{message}");
}

#[test]
fn a_controller_must_be_a_voter() {
    let message = invalid("[node]\nid = 2\n", "quorum.voters");
    assert!(message.contains("node.id 2"), "{message}");
}

#[test]
fn a_broker_only_node_must_not_be_a_voter() {
    let message = invalid("[node]\nroles = [\"broker\"]\n", "quorum.voters");
    assert!(message.contains("observer"), "{message}");

    let config = Config::from_toml_str("[node]\nid = 7\nroles = [\"broker\"]\n", &[]).unwrap();
    assert!(config.is_broker());
    assert!(!config.is_controller());
    assert!(!config.raft_config().is_voter());
}

#[test]
fn a_combined_node_is_a_voter() {
    let config = Config::from_toml_str("[node]\nroles = [\"broker\", \"controller\"]\n", &[]).unwrap();
    assert!(config.is_controller() && config.is_broker());
}

#[test]
fn unknown_keys_and_tables_are_rejected() {
    let err = Config::from_toml_str("[quorum]\nelection_timeout = 1000\n", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("[quorum]") && message.contains("election_timeout"),
        "{message}"
    );

    let err = Config::from_toml_str("[qourum]\nvoters = []\n", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
    assert!(err.to_string().contains("qourum"), "{err}");

    let err = Config::from_toml_str("[node.extra]\nx = 1\n", &[]).unwrap_err();
    assert!(err.to_string().contains("extra"), "{err}");
}

#[test]
fn syntax_errors_are_reported() {
    let err = Config::from_toml_str("[node\nid = 1", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
}

#[test]
fn missing_file_is_reported_with_its_path() {
    let err = Config::load(Path::new("/nonexistent/kraft.toml"), &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/kraft.toml"), "{err}");
}

#[test]
fn errors_from_a_file_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[quorum]\nfetch_timeout_ms = 0\n").unwrap();
    let err = Config::load(&path, &[]).unwrap_err();
    assert!(err.to_string().starts_with(&path.display().to_string()), "{err}");
    assert_eq!(err.key(), Some("quorum.fetch_timeout_ms"));
}

#[test]
fn overrides_apply_on_top_of_the_file() {
    let config = Config::load(
        &repo_file("config.toml"),
        &overrides(&[
            ("node.id", "2"),
            ("quorum.voters", r#"["1@127.0.0.1:9093","2@127.0.0.1:9094"]"#),
            ("listeners.http", "127.0.0.1:0"),
            ("listeners.raft", "127.0.0.1:9094"),
            ("node.data_dir", "/tmp/kraft-2"),
            ("node.cluster_id", "other-cluster"),
            ("quorum.election_timeout_ms", "250"),
        ]),
    )
    .unwrap();
    assert_eq!(config.node.id, 2);
    assert_eq!(config.quorum.voters.len(), 2);
    assert_eq!(config.quorum.voters[&2], "127.0.0.1:9094");
    assert_eq!(config.listeners.http.port(), 0);
    assert_eq!(config.listeners.raft.port(), 9094);
    assert_eq!(config.node.data_dir, PathBuf::from("/tmp/kraft-2"));
    assert_eq!(config.node.cluster_id, "other-cluster");
    assert_eq!(config.quorum.election_timeout_ms, 250);
    // Untouched keys keep the file's values.
    assert_eq!(config.quorum.fetch_timeout_ms, 2000);
}

#[test]
fn overrides_accept_kafka_style_lists_and_plain_strings() {
    let config = Config::from_toml_str(
        "",
        &overrides(&[
            ("node.roles", "broker,controller"),
            ("quorum.voters", "1@127.0.0.1:9093,2@localhost:9094"),
            ("node.cluster_id", "12345"),
        ]),
    )
    .unwrap();
    assert_eq!(config.node.roles, vec![NodeRole::Broker, NodeRole::Controller]);
    assert_eq!(config.quorum.voters[&2], "localhost:9094");
    assert_eq!(config.node.cluster_id, "12345");
}

#[test]
fn a_bad_override_is_blamed_on_the_command_line() {
    let err = Config::from_toml_str("", &overrides(&[("quorum.election_timeout_ms", "-5")])).unwrap_err();
    assert_eq!(err.key(), Some("quorum.election_timeout_ms"));
    assert!(err.to_string().starts_with("command-line override"), "{err}");

    let err = Config::from_toml_str("", &overrides(&[("quorum.election_timeout", "5")])).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
    assert!(err.to_string().starts_with("command-line override"), "{err}");

    let err = Config::from_toml_str("", &overrides(&[("election_timeout_ms", "5")])).unwrap_err();
    assert!(matches!(err, ConfigError::BadOverride { .. }), "{err:?}");
    let err = Config::from_toml_str("", &overrides(&[("a.b.c", "5")])).unwrap_err();
    assert!(matches!(err, ConfigError::BadOverride { .. }), "{err:?}");
}

#[test]
fn parse_override_splits_at_the_first_equals_sign() {
    assert_eq!(
        parse_override("node.id=2").unwrap(),
        ("node.id".to_string(), "2".to_string())
    );
    assert_eq!(
        parse_override("node.cluster_id=a=b").unwrap(),
        ("node.cluster_id".to_string(), "a=b".to_string())
    );
    assert!(parse_override("node.id").is_err());
    assert!(parse_override("=2").is_err());
}

#[test]
fn raft_config_maps_the_quorum_keys() {
    let config = Config::load(
        &repo_file("examples/node2.toml"),
        &overrides(&[
            ("quorum.election_timeout_ms", "300"),
            ("quorum.fetch_timeout_ms", "600"),
            ("quorum.retry_backoff_ms", "7"),
            ("quorum.request_timeout_ms", "400"),
            ("quorum.election_backoff_max_ms", "900"),
            ("quorum.append_linger_ms", "3"),
            ("log.max_batch_bytes", "65536"),
            ("metadata.max_idle_interval_ms", "123"),
        ]),
    )
    .unwrap();
    let raft = config.raft_config();
    assert_eq!(raft.node_id, 2);
    assert_eq!(raft.voters, config.quorum.voters);
    assert_eq!(raft.local_endpoint, "127.0.0.1:9094");
    assert!(raft.is_voter());
    assert_eq!(raft.election_timeout_ms, 300);
    assert_eq!(raft.fetch_timeout_ms, 600);
    assert_eq!(raft.retry_backoff_ms, 7);
    assert_eq!(raft.request_timeout_ms, 400);
    assert_eq!(raft.election_backoff_max_ms, 900);
    assert_eq!(raft.append_linger_ms, 3);
    assert_eq!(raft.max_batch_bytes, 65536);
    assert_eq!(raft.max_idle_interval_ms, 123);
    // A parked fetch returns well before the request would time out.
    assert!(raft.fetch_max_wait_ms < raft.request_timeout_ms);

    let default = Config::default().raft_config();
    assert_eq!(default.fetch_max_wait_ms, 500);
    assert_eq!(default.local_endpoint, "127.0.0.1:9093");
}
