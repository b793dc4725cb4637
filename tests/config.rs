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
    assert_eq!(
        config.node.roles,
        vec![NodeRole::Broker, NodeRole::Controller],
        "combined mode"
    );
    assert_eq!(config.node.state_machine, kraft::config::StateMachineKind::Metadata);
    assert_eq!(config.listeners.advertised, vec![]);
    assert_eq!(config.broker.rack, None);
    assert_eq!(config.node.data_dir, PathBuf::from("./data/node-1"));
    assert_eq!(config.node.cluster_id, "kraft-local");
    assert_eq!(config.listeners.raft.to_string(), "127.0.0.1:9093");
    assert_eq!(config.listeners.http.to_string(), "127.0.0.1:8080");
    assert_eq!(config.listeners.max_frame_bytes, 16_777_216);
    assert_eq!(config.listeners.http_workers, 0);
    assert_eq!(config.listeners.client, None, "the client protocol is opt-in");
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
    assert!(config.is_broker());
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
        ("[listeners]\nclient = \"localhost\"", "listeners.client"),
        ("[listeners]\nclient = 9092", "listeners.client"),
        ("[listeners]\nclient = \"127.0.0.1:70000\"", "listeners.client"),
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
fn the_client_listener_is_served_only_when_given_an_address() {
    let file = "[listeners]\nclient = \"127.0.0.1:9092\"";
    let config = Config::from_toml_str(file, &[]).unwrap();
    assert_eq!(config.listeners.client, Some("127.0.0.1:9092".parse().unwrap()));
    config.check().unwrap();
    // An empty value, in the file or on the command line, turns it off.
    let config = Config::from_toml_str("[listeners]\nclient = \"\"", &[]).unwrap();
    assert_eq!(config.listeners.client, None);
    let config = Config::from_toml_str(file, &overrides(&[("listeners.client", "")])).unwrap();
    assert_eq!(config.listeners.client, None);
    let config = Config::from_toml_str("", &overrides(&[("listeners.client", "127.0.0.1:0")])).unwrap();
    assert_eq!(config.listeners.client.map(|a| a.port()), Some(0));
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

// ---------------------------------------------------------------------------
// A config built in code (`Config::check`) is held to the file's rules.

/// Sets one integer key on a config built in code.
type SetInteger = fn(&mut Config, u64);

/// Breaks one rule of a config built in code.
type BreakRule = fn(&mut Config);

/// Every integer key, with how to set it on a config built in code.
const INTEGER_KEYS: &[(&str, SetInteger)] = &[
    ("node.id", |c, v| c.node.id = v as i32),
    ("listeners.max_frame_bytes", |c, v| c.listeners.max_frame_bytes = v),
    ("listeners.http_workers", |c, v| c.listeners.http_workers = v as usize),
    ("quorum.election_timeout_ms", |c, v| c.quorum.election_timeout_ms = v),
    ("quorum.fetch_timeout_ms", |c, v| c.quorum.fetch_timeout_ms = v),
    ("quorum.retry_backoff_ms", |c, v| c.quorum.retry_backoff_ms = v),
    ("quorum.request_timeout_ms", |c, v| c.quorum.request_timeout_ms = v),
    ("quorum.election_backoff_max_ms", |c, v| {
        c.quorum.election_backoff_max_ms = v
    }),
    ("quorum.append_linger_ms", |c, v| c.quorum.append_linger_ms = v),
    ("metadata.max_idle_interval_ms", |c, v| {
        c.metadata.max_idle_interval_ms = v
    }),
    ("broker.heartbeat_interval_ms", |c, v| {
        c.broker.heartbeat_interval_ms = v
    }),
    ("broker.session_timeout_ms", |c, v| c.broker.session_timeout_ms = v),
    ("log.max_batch_bytes", |c, v| c.log.max_batch_bytes = v as usize),
    ("log.retention_bytes", |c, v| c.log.retention_bytes = v),
    ("log.retention_ms", |c, v| c.log.retention_ms = v),
    ("log.cleaner_interval_ms", |c, v| c.log.cleaner_interval_ms = v),
    ("snapshot.max_bytes_between", |c, v| c.snapshot.max_bytes_between = v),
    ("snapshot.max_interval_ms", |c, v| c.snapshot.max_interval_ms = v),
];

/// The values near which some key's rule changes its answer.
const EDGES: &[u64] = &[
    0,
    10,
    64,
    2_000,
    9_000,
    8 * 1024 * 1024,
    9 * 1024 * 1024,
    i32::MAX as u64,
    u32::MAX as u64,
    10 * 365 * 24 * 3600 * 1000,
];

proptest::proptest! {
    /// The file and the code agree on every integer key: a value
    /// `config.toml` refuses is refused in a built config, naming the same
    /// key, and a value it accepts gives the same config both ways.
    #[test]
    fn a_built_config_and_a_file_accept_the_same_integers(
        key in 0..INTEGER_KEYS.len(),
        value in proptest::prop_oneof![
            (0..EDGES.len(), -2i64..=2).prop_map(|(i, d)| EDGES[i].saturating_add_signed(d)),
            0..=i64::MAX as u64,
        ],
    ) {
        let (name, set) = INTEGER_KEYS[key];
        let (table, field) = name.split_once('.').unwrap();
        let from_file = Config::from_toml_str(&format!("[{table}]\n{field} = {value}"), &[]);
        let mut built = Config::default();
        set(&mut built, value);
        // node.id beyond i32 and others beyond usize cannot be built at all.
        let representable = name != "node.id" || value <= i32::MAX as u64;
        proptest::prop_assume!(representable);
        match (from_file, built.check()) {
            (Ok(file), Ok(())) => proptest::prop_assert_eq!(file, built),
            (Err(file), Err(code)) => {
                // A heartbeat no shorter than the session: the file blames
                // the key it set, a built config the session.
                fn blamed(e: &ConfigError) -> Option<&str> {
                    match e.key() {
                        Some("broker.heartbeat_interval_ms") => Some("broker.session_timeout_ms"),
                        key => key,
                    }
                }
                proptest::prop_assert_eq!(blamed(&file), blamed(&code), "{} / {}", file, code);
            }
            (file, code) => proptest::prop_assert!(false, "{name} = {value}: file {file:?}, code {code:?}"),
        }
    }
}

use proptest::strategy::Strategy;

#[test]
fn the_shipped_configs_pass_the_check_of_a_built_config() {
    Config::default().check().unwrap();
    for name in [
        "config.toml",
        "examples/node1.toml",
        "examples/node2.toml",
        "examples/node3.toml",
    ] {
        let config = Config::load(&repo_file(name), &[]).unwrap();
        config.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_built_config_is_held_to_the_rules_of_the_file() {
    let breaks: &[(&str, BreakRule)] = &[
        ("node.id", |c| c.node.id = -1),
        ("node.roles", |c| c.node.roles.clear()),
        ("node.roles", |c| {
            c.node.roles = vec![NodeRole::Controller, NodeRole::Controller]
        }),
        ("node.data_dir", |c| c.node.data_dir = PathBuf::from("")),
        ("node.cluster_id", |c| c.node.cluster_id = String::new()),
        ("node.cluster_id", |c| c.node.cluster_id = "a b".to_string()),
        ("node.cluster_id", |c| c.node.cluster_id = "x".repeat(256)),
        ("listeners.max_frame_bytes", |c| c.listeners.max_frame_bytes = u64::MAX),
        ("quorum.voters", |c| c.quorum.voters.clear()),
        ("quorum.voters", |c| {
            c.quorum.voters.insert(1, "127.0.0.1".to_string());
        }),
        ("quorum.voters", |c| {
            c.quorum.voters.insert(2, "127.0.0.1:0".to_string());
        }),
        ("quorum.voters", |c| {
            c.quorum.voters.insert(1, " 127.0.0.1:9093".to_string());
        }),
        ("quorum.voters", |c| {
            c.quorum.voters.insert(2, "127.0.0.1:9093".to_string());
        }),
        ("quorum.voters", |c| {
            c.quorum.voters.insert(-2, "127.0.0.1:9094".to_string());
        }),
        ("quorum.voters", |c| c.node.id = 2),
        ("quorum.voters", |c| c.node.roles = vec![NodeRole::Broker]),
        ("quorum.election_timeout_ms", |c| {
            c.quorum.election_timeout_ms = u64::MAX
        }),
        ("broker.session_timeout_ms", |c| c.broker.heartbeat_interval_ms = 9_000),
    ];
    for (key, break_rule) in breaks {
        let mut config = Config::default();
        break_rule(&mut config);
        let err = config.check().expect_err(&format!("{config:?} must be refused"));
        assert_eq!(err.key(), Some(*key), "{err}");
        let message = err.to_string();
        assert!(message.starts_with("config built in code: "), "{message}");
        assert!(message.contains("expected"), "{message}");
    }
    let err = {
        let mut config = Config::default();
        config.node.cluster_id = "a b".to_string();
        config.check().unwrap_err()
    };
    assert_eq!(
        err.to_string(),
        "config built in code: node.cluster_id = \"a b\": expected a non-empty string of at most 255 \
         characters from [A-Za-z0-9._-]"
    );
}

#[test]
fn a_built_config_may_count_bytes_beyond_toml_and_a_lone_voter_may_keep_port_0() {
    // TOML's integers stop at i64::MAX; a built config may say "never".
    let mut config = Config::default();
    config.snapshot.max_bytes_between = u64::MAX;
    config.log.retention_bytes = u64::MAX;
    config.check().unwrap();
    // A broker-only node that is not a voter is fine too.
    let mut observer = Config::default();
    observer.node.id = 4;
    observer.node.roles = vec![NodeRole::Broker];
    observer.check().unwrap();
    // A single-node quorum on a free port (examples/embed.rs): nobody dials
    // its voter entry, so port 0 is fine there, and only there.
    let mut lone = Config::default();
    lone.listeners.raft = "127.0.0.1:0".parse().unwrap();
    lone.quorum.voters.insert(1, "127.0.0.1:0".to_string());
    lone.check().unwrap();
    lone.quorum.voters.insert(2, "127.0.0.1:9094".to_string());
    assert_eq!(lone.check().unwrap_err().key(), Some("quorum.voters"));
}

#[test]
fn security_tokens_file_is_a_path_or_empty_for_none() {
    let config = Config::from_toml_str("[security]\ntokens_file = \"/etc/kraft/tokens\"\n", &[]).unwrap();
    assert_eq!(
        config.security.tokens_file.as_deref(),
        Some(std::path::Path::new("/etc/kraft/tokens"))
    );
    let config = Config::from_toml_str("[security]\ntokens_file = \"\"\n", &[]).unwrap();
    assert_eq!(config.security.tokens_file, None);
    assert!(invalid("[security]\ntokens_file = 5\n", "security.tokens_file").contains("tokens file"));
}
