//! The metadata layer on whole nodes (`node.state_machine = "metadata"`):
//! replay into an image on every node, the controller on the active leader,
//! image snapshots, and the HTTP resources.
//!
//! Waits poll with a bound (at most [`WAIT`]) and never assert on timings.

mod ports;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kraft::config::{Config, NodeRole, StateMachineKind};
use kraft::metadata::controller::{BrokerRegistrationRequest, ConfigChange, NewTopic, TopicLayout};
use kraft::metadata::records::CONFIG_RESOURCE_TOPIC;
use kraft::node::{self, AppendError, ControllerError, MetadataImage, NodeHandle, Operation};
use kraft::raft::NodeId;
use serde_json::Value;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(25);

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn config(id: NodeId, ports: &[u16], dir: &Path) -> Config {
    let mut config = Config::default();
    config.node.id = id;
    config.node.cluster_id = "metadata-test".to_string();
    config.node.data_dir = dir.to_path_buf();
    config.node.state_machine = StateMachineKind::Metadata;
    // Controllers only: the tests register the brokers they want.
    config.node.roles = vec![NodeRole::Controller];
    config.quorum.voters = ports
        .iter()
        .enumerate()
        .map(|(i, port)| (i as NodeId + 1, format!("127.0.0.1:{port}")))
        .collect();
    config.listeners.raft = config.quorum.voters[&id].parse().unwrap();
    config.listeners.http = "127.0.0.1:0".parse().unwrap();
    config.quorum.election_timeout_ms = 300;
    config.quorum.fetch_timeout_ms = 600;
    config.quorum.request_timeout_ms = 1000;
    config.quorum.election_backoff_max_ms = 300;
    config.metadata.max_idle_interval_ms = 200;
    config.broker.heartbeat_interval_ms = 500;
    config.broker.session_timeout_ms = 2_000;
    config
}

/// The image once the controller wrote `metadata.version`.
async fn bootstrapped(node: &NodeHandle) -> MetadataImage {
    eventually("metadata.version in the image", || async {
        node.metadata_image()
            .filter(|i| i.features.contains_key("metadata.version"))
    })
    .await
}

fn registration(id: i32) -> BrokerRegistrationRequest {
    BrokerRegistrationRequest {
        broker_id: id,
        incarnation_id: Uuid::new_v4(),
        listeners: Vec::new(),
        rack: None,
        features: kraft::metadata::controller::supported_features(),
    }
}

/// Registers broker `id` and heartbeats until it is unfenced; its epoch.
async fn unfenced_broker(node: &NodeHandle, id: i32) -> i64 {
    let answer = node.operate(Operation::RegisterBroker(registration(id))).await.unwrap();
    let epoch = answer.broker_epoch.unwrap();
    eventually("the broker unfenced", || async {
        let offset = node.metadata_image().unwrap().offset;
        let beat = Operation::BrokerHeartbeat {
            broker_id: id,
            broker_epoch: epoch,
            metadata_offset: offset,
            want_fence: false,
            want_shutdown: false,
        };
        let answer = node.operate(beat).await.ok()?;
        (!answer.heartbeat?.is_fenced).then_some(())
    })
    .await;
    epoch
}

fn new_topic(name: &str, partitions: i32) -> Operation {
    Operation::CreateTopic(NewTopic {
        name: name.to_string(),
        layout: TopicLayout::Counts {
            partitions,
            replication_factor: 1,
        },
        configs: BTreeMap::new(),
    })
}

#[actix_rt::test]
async fn a_single_node_controller_registers_brokers_creates_topics_and_keeps_them_across_a_restart() {
    let ports = vec![ports::free_port()];
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(config(1, &ports, dir.path())).await.unwrap();
    bootstrapped(&node).await;

    // Raw records have no place in a metadata log.
    match node.append(vec![b"raw".to_vec()]).await {
        Err(AppendError::Unsupported(_)) => {}
        other => panic!("a raw append in metadata mode: {other:?}"),
    }

    // A topic needs brokers.
    match node.operate(new_topic("orders", 3)).await {
        Err(ControllerError::InvalidReplicationFactor(_)) => {}
        other => panic!("a topic without brokers: {other:?}"),
    }
    let epoch = unfenced_broker(&node, 1).await;
    // The node replays what the controller committed, a moment later.
    let image = eventually("the replayed image to show the broker unfenced", || async {
        node.metadata_image()
            .filter(|i| i.brokers.get(&1).is_some_and(|b| !b.fenced))
    })
    .await;
    assert_eq!(
        image.brokers[&1].epoch, epoch,
        "a broker's epoch is its registration's offset"
    );

    let created = node.operate(new_topic("orders", 3)).await.unwrap();
    let topic = created
        .image
        .topic("orders")
        .expect("the answer's image holds the topic");
    assert_eq!(topic.partitions.len(), 3);
    assert!(topic.partitions.values().all(|p| p.leader == 1 && p.isr == vec![1]));
    match node.operate(new_topic("orders", 1)).await {
        Err(ControllerError::TopicAlreadyExists(_)) => {}
        other => panic!("a second topic of the same name: {other:?}"),
    }
    match node
        .operate(new_topic("ord.ers", 1))
        .await
        .and(node.operate(new_topic("ord_ers", 1)).await)
    {
        Err(ControllerError::InvalidTopic(_)) => {}
        other => panic!("names that collide on '.' and '_': {other:?}"),
    }
    let mut set = BTreeMap::new();
    set.insert("retention.ms".to_string(), "60000".to_string());
    let change = |set: BTreeMap<String, String>| Operation::AlterConfigs {
        resource_type: CONFIG_RESOURCE_TOPIC,
        name: "orders".to_string(),
        change: ConfigChange {
            set,
            delete: Vec::new(),
        },
    };
    node.operate(change(set)).await.unwrap();
    let mut unknown = BTreeMap::new();
    unknown.insert("no.such.key".to_string(), "1".to_string());
    match node.operate(change(unknown)).await {
        Err(ControllerError::InvalidConfig(_)) => {}
        other => panic!("an unknown config key: {other:?}"),
    }

    // The replayed image shows what the controller answered.
    let before = eventually("the image to show the config", || async {
        node.metadata_image().filter(|i| !i.configs.is_empty())
    })
    .await;
    let snapshot = node.create_snapshot().await.unwrap();
    assert!(snapshot.created && snapshot.end_offset > before.offset);
    node.shutdown().await;

    let node = node::start(config(1, &ports, dir.path())).await.unwrap();
    let after = eventually("the image back after a restart", || async {
        node.metadata_image().filter(|i| i.offset >= before.offset)
    })
    .await;
    assert_eq!(after.topic("orders").unwrap().partitions.len(), 3);
    // The same cluster (NoOps may have moved the offset since).
    assert_eq!(after.fingerprint(), before.fingerprint());
    assert_eq!(after.brokers, before.brokers);
    assert_eq!(after.topics_by_id, before.topics_by_id);
    assert_eq!(after.configs, before.configs);
    node.shutdown().await;
}

#[actix_rt::test]
async fn every_node_replays_the_same_image_and_a_new_controller_carries_on() {
    let ports: Vec<u16> = (0..3).map(|_| ports::free_port()).collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        nodes.push(node::start(config(i as NodeId + 1, &ports, dir.path())).await.unwrap());
    }
    // Every node takes operations: a follower forwards them to the active
    // controller and answers once its own image shows the result.
    eventually("an active controller", || async {
        nodes[0]
            .operate(Operation::RegisterBroker(registration(100)))
            .await
            .ok()
    })
    .await;
    let leader = nodes[0].describe().await.unwrap().leader_id.unwrap() as usize - 1;
    let follower = (leader + 1) % 3;
    unfenced_broker(&nodes[follower], 7).await;
    let created = nodes[follower].operate(new_topic("forwarded", 1)).await.unwrap();
    assert!(
        created.image.topic("forwarded").is_some(),
        "the follower's answer comes with its own image, which has the topic"
    );
    assert!(nodes[follower].metadata_image().unwrap().topic("forwarded").is_some());
    let created = nodes[leader].operate(new_topic("orders", 2)).await.unwrap();
    let offset = created.image.offset;
    let images: Vec<MetadataImage> = {
        let mut images = Vec::new();
        for node in &nodes {
            images.push(
                eventually("every node to replay the topic", || async {
                    node.metadata_image().filter(|i| i.offset >= offset)
                })
                .await,
            );
        }
        images
    };
    for image in &images {
        assert_eq!(image.topics_by_id, images[0].topics_by_id);
        assert_eq!(image.brokers, images[0].brokers);
    }

    // The active controller goes; the next one has every topic and writes.
    nodes[leader].shutdown().await;
    let rest: Vec<&NodeHandle> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, n)| n)
        .collect();
    let created = eventually("a new active controller", || async {
        for node in &rest {
            if let Ok(answer) = node.operate(new_topic("payments", 1)).await {
                return Some(answer);
            }
        }
        None
    })
    .await;
    assert!(
        created.image.topic("orders").is_some(),
        "the new controller sees the old one's topics"
    );
    assert!(created.image.topic("payments").is_some());
    for node in rest {
        node.shutdown().await;
    }
}

#[actix_rt::test]
async fn the_http_resources_create_and_show_topics_with_kafkas_error_names() {
    let ports = vec![ports::free_port()];
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(config(1, &ports, dir.path())).await.unwrap();
    bootstrapped(&node).await;
    let (server, addr) = kraft::api::http_server(node.clone(), "127.0.0.1:0".parse().unwrap()).unwrap();
    let server_handle = server.handle();
    actix_rt::spawn(server);
    let base = format!("http://{addr}");
    let call = |method: &'static str, path: String, body: Option<Value>| {
        let url = format!("{base}{path}");
        async move {
            let client = reqwest::Client::new();
            let request = client.request(method.parse().unwrap(), url);
            let request = match body {
                Some(body) => request.json(&body),
                None => request,
            };
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }
    };

    let (status, body) = call(
        "POST",
        "/v1/brokers".into(),
        Some(serde_json::json!({"id": 1, "incarnation_id": Uuid::new_v4(),
            "listeners": [{"name": "PLAINTEXT", "host": "localhost", "port": 9092}], "rack": null})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let epoch = body["epoch"].as_i64().unwrap();
    eventually("the broker unfenced over HTTP", || {
        let offset = node.metadata_image().unwrap().offset;
        async move {
            let (status, body) = call(
                "POST",
                "/v1/brokers/1/heartbeat".into(),
                Some(serde_json::json!({"epoch": epoch, "metadata_offset": offset})),
            )
            .await;
            (status == 200 && body["is_fenced"] == false).then_some(())
        }
    })
    .await;
    let (status, body) = call(
        "POST",
        "/v1/topics".into(),
        Some(
            serde_json::json!({"name": "orders", "partitions": 2, "replication_factor": 1,
            "configs": {"cleanup.policy": "compact"}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "orders");
    assert_eq!(body["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(body["partitions"][0]["leader"], 1);
    assert_eq!(body["configs"]["cleanup.policy"], "compact");

    let (status, body) = call(
        "POST",
        "/v1/topics".into(),
        Some(serde_json::json!({"name": "orders", "partitions": 1})),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (409, Some("TOPIC_ALREADY_EXISTS")));
    let (status, body) = call(
        "POST",
        "/v1/topics".into(),
        Some(serde_json::json!({"name": "a/b", "partitions": 1})),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (400, Some("INVALID_TOPIC_EXCEPTION")));
    let (status, body) = call("GET", "/v1/topics/nope".into(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("UNKNOWN_TOPIC_OR_PARTITION"))
    );
    let (status, body) = call(
        "PATCH",
        "/v1/configs/topic/orders".into(),
        Some(serde_json::json!({"set": {"retention.ms": "-5"}})),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (400, Some("INVALID_CONFIG")));
    let (status, body) = call(
        "POST",
        "/v1/brokers/1/heartbeat".into(),
        Some(serde_json::json!({"epoch": epoch + 1000, "metadata_offset": 0})),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (409, Some("STALE_BROKER_EPOCH")));
    let (status, body) = call("POST", "/v1/append".into(), Some(serde_json::json!({"records": ["x"]}))).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("UNSUPPORTED")));

    let listed = eventually("the topic listed", || async move {
        let (_, body) = call("GET", "/v1/topics".into(), None).await;
        (body["topics"].as_array()?.len() == 1).then_some(body)
    })
    .await;
    assert_eq!(listed["topics"][0]["partitions"], 2);
    let (status, image) = call("GET", "/v1/image".into(), None).await;
    assert_eq!(status, 200);
    assert_eq!(image["features"]["metadata.version"], 1);
    assert_eq!(image["brokers"][0]["listeners"][0]["security_protocol"], "PLAINTEXT");

    let (status, log) = call("GET", "/v1/log?from=0&max=1000".into(), None).await;
    assert_eq!(status, 200);
    let kinds: Vec<&str> = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"FeatureLevelRecord") && kinds.contains(&"RegisterBrokerRecord"),
        "{kinds:?}"
    );
    let topic = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "TopicRecord")
        .unwrap();
    assert_eq!(topic["record"]["name"], "orders");

    // Features.
    let (status, features) = call("GET", "/v1/features".into(), None).await;
    assert_eq!(
        (status, &features["features"]["metadata.version"]),
        (200, &serde_json::json!(1))
    );
    let (status, body) = call(
        "PATCH",
        "/v1/features".into(),
        Some(serde_json::json!({"metadata.version": 2})),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (409, Some("INVALID_UPDATE_VERSION")));

    // AlterPartition from a partition's leader, and a preferred election.
    let (_, body) = call(
        "POST",
        "/v1/brokers".into(),
        Some(serde_json::json!({"id": 2, "incarnation_id": Uuid::new_v4()})),
    )
    .await;
    let epoch2 = body["epoch"].as_i64().unwrap();
    eventually("broker 2 unfenced", || {
        let offset = node.metadata_image().unwrap().offset;
        async move {
            let (_, body) = call(
                "POST",
                "/v1/brokers/2/heartbeat".into(),
                Some(serde_json::json!({"epoch": epoch2, "metadata_offset": offset})),
            )
            .await;
            (body["is_fenced"] == false).then_some(())
        }
    })
    .await;
    let (status, pairs) = call(
        "POST",
        "/v1/topics".into(),
        Some(serde_json::json!({"name": "pairs", "assignments": [[1, 2]]})),
    )
    .await;
    assert_eq!(status, 200, "{pairs}");
    let alter = |leader_epoch: i64, partition_epoch: i64| {
        serde_json::json!({"broker_id": 1, "broker_epoch": epoch, "topics": [{"topic_id": pairs["id"],
            "partitions": [{"partition": 0, "leader_epoch": leader_epoch, "partition_epoch": partition_epoch, "new_isr": [1]}]}]})
    };
    let (status, altered) = call("POST", "/v1/partitions/alter".into(), Some(alter(0, 0))).await;
    assert_eq!(status, 200, "{altered}");
    let result = &altered["topics"][0]["partitions"][0];
    assert_eq!(
        (result["error"].clone(), result["isr"].clone()),
        (Value::Null, serde_json::json!([1]))
    );
    assert_eq!(result["partition_epoch"], 1);
    let (_, stale) = call("POST", "/v1/partitions/alter".into(), Some(alter(0, 0))).await;
    assert_eq!(stale["topics"][0]["partitions"][0]["error"], "INVALID_UPDATE_VERSION");
    let (status, elected) = call(
        "POST",
        "/v1/partitions/elect".into(),
        Some(serde_json::json!({"topic": "pairs", "partition": 0})),
    )
    .await;
    assert_eq!(
        (status, elected["leader"].clone()),
        (200, serde_json::json!(1)),
        "{elected}"
    );

    let (status, _) = call("DELETE", "/v1/topics/orders".into(), None).await;
    assert_eq!(status, 200);
    let (status, _) = call("DELETE", "/v1/topics/orders".into(), None).await;
    assert_eq!(status, 404);

    server_handle.stop(true).await;
    node.shutdown().await;
}

/// A node of `roles` in a quorum of `ports.len()` voters.
fn config_with_roles(id: NodeId, ports: &[u16], raft_port: u16, dir: &Path, roles: &[NodeRole]) -> Config {
    let mut config = config(1, ports, dir);
    config.node.id = id;
    config.node.roles = roles.to_vec();
    config.listeners.raft = format!("127.0.0.1:{raft_port}").parse().unwrap();
    config
}

#[actix_rt::test]
async fn a_combined_node_registers_itself_and_holds_a_topic_of_replication_factor_one() {
    let ports = vec![ports::free_port()];
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_roles(
        1,
        &ports,
        ports[0],
        dir.path(),
        &[NodeRole::Broker, NodeRole::Controller],
    );
    let node = node::start(config).await.unwrap();
    eventually("the node registered and unfenced as broker 1", || async {
        node.metadata_image()
            .filter(|i| i.brokers.get(&1).is_some_and(|b| !b.fenced))
    })
    .await;
    let created = node.operate(new_topic("orders", 2)).await.unwrap();
    assert!(created
        .image
        .topic("orders")
        .unwrap()
        .partitions
        .values()
        .all(|p| p.leader == 1));
    node.shutdown().await;
}

#[actix_rt::test]
async fn brokers_register_through_any_voter_and_a_stopping_broker_hands_its_leadership_over() {
    let voter_ports: Vec<u16> = (0..3).map(|_| ports::free_port()).collect();
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut voters = Vec::new();
    for i in 0..3 {
        voters.push(
            node::start(config(i + 1, &voter_ports, dirs[i as usize].path()))
                .await
                .unwrap(),
        );
    }
    let mut brokers = Vec::new();
    for (i, id) in [4, 5].into_iter().enumerate() {
        let config = config_with_roles(
            id,
            &voter_ports,
            ports::free_port(),
            dirs[3 + i].path(),
            &[NodeRole::Broker],
        );
        brokers.push(node::start(config).await.unwrap());
    }
    let both = eventually("both brokers registered and unfenced", || async {
        let image = voters[0].metadata_image()?;
        [4, 5]
            .iter()
            .all(|id| image.brokers.get(id).is_some_and(|b| !b.fenced))
            .then_some(image)
    })
    .await;
    assert!(both.brokers[&4].listeners[0].name == "PLAINTEXT");
    // A topic whose every partition has both brokers, led by broker 4.
    let topic = Operation::CreateTopic(NewTopic {
        name: "orders".into(),
        layout: TopicLayout::Assignments(vec![vec![4, 5], vec![4, 5]]),
        configs: BTreeMap::new(),
    });
    let created = brokers[1].operate(topic).await.unwrap();
    assert!(created
        .image
        .topic("orders")
        .unwrap()
        .partitions
        .values()
        .all(|p| p.leader == 4));

    // Broker 4 stops gracefully: controlled shutdown moves its leadership.
    brokers.remove(0).shutdown().await;
    let image = eventually("the voter to replay the controlled shutdown", || async {
        voters[0]
            .metadata_image()
            .filter(|i| i.brokers.get(&4).is_some_and(|b| b.in_controlled_shutdown))
    })
    .await;
    let orders = image.topic("orders").unwrap();
    assert!(
        orders.partitions.values().all(|p| p.leader == 5 && p.isr == vec![5]),
        "broker 4 led nothing and was in no ISR when it stopped: {orders:?}"
    );

    for node in brokers.into_iter().chain(voters) {
        node.shutdown().await;
    }
}

#[actix_rt::test]
async fn a_follower_behind_the_log_start_installs_the_leaders_image_snapshot_and_agrees() {
    let ports: Vec<u16> = (0..3).map(|_| ports::free_port()).collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let config_of = |i: usize| {
        let mut config = config(i as NodeId + 1, &ports, dirs[i].path());
        // Snapshots only on demand; the cleaner compacts at once.
        config.snapshot.max_bytes_between = u64::MAX;
        config.log.retention_bytes = 1;
        config.log.cleaner_interval_ms = 50;
        // No broker is fenced while the images are compared.
        config.broker.session_timeout_ms = 600_000;
        config
    };
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Some(node::start(config_of(i)).await.unwrap()));
    }
    let active = |nodes: &Vec<Option<NodeHandle>>| nodes.iter().flatten().cloned().collect::<Vec<_>>();
    eventually("an active controller", || async {
        active(&nodes)[0]
            .operate(Operation::RegisterBroker(registration(9)))
            .await
            .ok()
    })
    .await;
    let leader = nodes[0].as_ref().unwrap().describe().await.unwrap().leader_id.unwrap() as usize - 1;
    let follower = (leader + 1) % 3;
    let leader_node = nodes[leader].clone().unwrap();
    unfenced_broker(&leader_node, 7).await;
    leader_node.operate(new_topic("before", 2)).await.unwrap();
    nodes[follower].take().unwrap().shutdown().await;
    for i in 0..20 {
        leader_node.operate(new_topic(&format!("away-{i}"), 1)).await.unwrap();
    }
    leader_node
        .operate(Operation::DeleteTopic { name: "away-3".into() })
        .await
        .unwrap();
    eventually("the leader's image to have everything", || async {
        leader_node
            .metadata_image()
            .filter(|i| i.topic("away-19").is_some() && i.topic("away-3").is_none())
    })
    .await;
    let snapshot = leader_node.create_snapshot().await.expect("snapshot written");
    eventually("the leader to compact its log", || async {
        let status = leader_node.describe().await.ok()?;
        (status.log_start_offset == snapshot.end_offset).then_some(())
    })
    .await;

    let restarted = node::start(config_of(follower)).await.unwrap();
    nodes[follower] = Some(restarted.clone());
    let last = leader_node.operate(new_topic("after", 1)).await.unwrap().image;
    let image = eventually("the follower to install the snapshot and catch up", || async {
        let status = restarted.describe().await.ok()?;
        let image = restarted.metadata_image()?;
        (status.log_start_offset >= snapshot.end_offset && image.topic("after").is_some()).then_some(image)
    })
    .await;
    assert_eq!(image.topics_by_id, last.topics_by_id);
    assert_eq!(image.brokers, last.brokers);
    assert_eq!(image.features, last.features);
    assert!(image.topic("away-3").is_none() && image.topic("before").is_some());
    for node in nodes.into_iter().flatten() {
        node.shutdown().await;
    }
}
