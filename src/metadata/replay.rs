//! The metadata state machine: every node replays the committed metadata
//! records into a [`MetadataImage`] and publishes each new image to its
//! subscribers (Kafka's MetadataLoader and its publishers).
//!
//! A delivery of committed records becomes one [`MetadataDelta`], applied
//! at its end: the next image shares what the records did not touch. A
//! record that does not decode (an unknown apiKey, a newer version) or does
//! not fit the image stops replay on this node at that record, loudly: the
//! image stays at the last record that fitted, and never skips one. Its
//! snapshots hold the image's records (features, brokers, topics with their
//! partitions, configs), made from an immutable image on the thread that
//! writes the file.

use std::sync::{Arc, Mutex};

use actix::{Message, Recipient};
use tokio::sync::watch;

use super::image::{Changes, MetadataDelta, MetadataImage};
use super::records::MetadataRecord;
use crate::actors::state_machine::StateMachine;
use crate::messages::actor::LeaderChanged;
use crate::messages::records::CommittedRecord;
use crate::messages::{Record, SnapshotId};
use crate::storage::StateRecords;

/// A new image, sent to every subscriber (`NodeHandle::subscribe_metadata`)
/// in the order the images were made.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct MetadataUpdate {
    /// The image; `image.offset` is the last offset it reflects.
    pub image: MetadataImage,
    /// What changed since the previous update. None when the image was
    /// replaced wholesale: a snapshot was loaded, or this is the first
    /// update a new subscriber gets.
    pub changes: Option<Arc<Changes>>,
}

/// Where a node's images go: the latest one for reads, and the
/// subscribers. Cheap to clone; shared by the state machine and the node's
/// handle.
#[derive(Clone)]
pub struct MetadataPublisher {
    inner: Arc<Mutex<Subscribers>>,
    latest: watch::Receiver<MetadataImage>,
}

struct Subscribers {
    latest: watch::Sender<MetadataImage>,
    recipients: Vec<Recipient<MetadataUpdate>>,
    /// Told of leader changes, in order with the images (the controller).
    leadership: Vec<Recipient<LeaderChanged>>,
    last_leader: Option<LeaderChanged>,
}

impl Default for MetadataPublisher {
    fn default() -> Self {
        MetadataPublisher::new()
    }
}

impl MetadataPublisher {
    pub fn new() -> MetadataPublisher {
        let (latest, receiver) = watch::channel(MetadataImage::empty());
        MetadataPublisher {
            inner: Arc::new(Mutex::new(Subscribers {
                latest,
                recipients: Vec::new(),
                leadership: Vec::new(),
                last_leader: None,
            })),
            latest: receiver,
        }
    }

    /// The newest image (a clone shares all of it).
    pub fn image(&self) -> MetadataImage {
        self.latest.borrow().clone()
    }

    /// A receiver that sees every new image (the newest at least).
    pub fn watch(&self) -> watch::Receiver<MetadataImage> {
        self.latest.clone()
    }

    /// Adds a subscriber; it gets the newest image at once, then every new
    /// one. A subscriber whose mailbox has closed is dropped.
    pub fn subscribe(&self, recipient: Recipient<MetadataUpdate>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let image = inner.latest.borrow().clone();
        recipient.do_send(MetadataUpdate { image, changes: None });
        inner.recipients.push(recipient);
    }

    /// Adds a subscriber to the images and the leader changes, in order
    /// (the controller): the newest image and leader at once.
    pub(crate) fn subscribe_with_leadership(
        &self,
        images: Recipient<MetadataUpdate>,
        leadership: Recipient<LeaderChanged>,
    ) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let image = inner.latest.borrow().clone();
        images.do_send(MetadataUpdate { image, changes: None });
        if let Some(last) = &inner.last_leader {
            leadership.do_send(last.clone());
        }
        inner.recipients.push(images);
        inner.leadership.push(leadership);
    }

    fn publish_leader(&self, change: &LeaderChanged) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.last_leader = Some(change.clone());
        inner.leadership.retain(|r| r.connected());
        for recipient in &inner.leadership {
            recipient.do_send(change.clone());
        }
    }

    fn publish(&self, image: MetadataImage, changes: Option<Changes>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.latest.send_replace(image.clone());
        let changes = changes.map(Arc::new);
        inner.recipients.retain(|r| r.connected());
        for recipient in &inner.recipients {
            recipient.do_send(MetadataUpdate {
                image: image.clone(),
                changes: changes.clone(),
            });
        }
    }
}

/// The metadata image as a [`StateMachine`].
pub struct MetadataStateMachine {
    image: MetadataImage,
    publisher: MetadataPublisher,
}

impl MetadataStateMachine {
    pub fn new(publisher: MetadataPublisher) -> MetadataStateMachine {
        MetadataStateMachine {
            image: MetadataImage::empty(),
            publisher,
        }
    }
}

impl StateMachine for MetadataStateMachine {
    fn apply(&mut self, records: &[CommittedRecord]) -> Result<(), String> {
        let mut delta = MetadataDelta::new(&self.image);
        let mut replayed = Ok(());
        for committed in records {
            let step = match &committed.record {
                Record::Data(bytes) => delta.replay_bytes(committed.offset, committed.epoch, bytes),
                _ => {
                    delta.advance(committed.offset, committed.epoch);
                    Ok(())
                }
            };
            if let Err(e) = step {
                replayed = Err(e.to_string());
                break;
            }
        }
        // What fitted before a record that did not is kept and published.
        let (image, changes) = delta.apply();
        if image.offset != self.image.offset {
            self.image = image.clone();
            self.publisher.publish(image, Some(changes));
        }
        replayed
    }

    fn load(&mut self, id: SnapshotId, records: &[Record]) -> Result<(), String> {
        let mut decoded = Vec::with_capacity(records.len());
        for (i, record) in records.iter().enumerate() {
            match record {
                Record::Data(bytes) => {
                    decoded.push(MetadataRecord::decode(bytes).map_err(|e| format!("record {i} of the snapshot: {e}"))?)
                }
                other => {
                    return Err(format!(
                        "record {i} of the snapshot is not a metadata record: {other:?}"
                    ))
                }
            }
        }
        let image = MetadataImage::from_records(id.end_offset, id.epoch, decoded).map_err(|e| e.to_string())?;
        self.image = image.clone();
        self.publisher.publish(image, None);
        Ok(())
    }

    fn leader_changed(&mut self, change: &LeaderChanged) {
        self.publisher.publish_leader(change);
    }

    fn snapshot(&self) -> Option<(SnapshotId, StateRecords)> {
        if self.image.offset < 0 {
            return None;
        }
        let id = SnapshotId {
            end_offset: self.image.offset + 1,
            epoch: self.image.epoch,
        };
        // The image is immutable and shared: its records are made on the
        // thread that writes the file.
        let image = self.image.clone();
        let records = std::iter::once(())
            .flat_map(move |()| image.records())
            .map(|record| Record::Data(record.encode()));
        Some((id, Box::new(records)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::records::*;
    use uuid::Uuid;

    fn committed(offset: i64, epoch: i32, record: Record) -> CommittedRecord {
        CommittedRecord { offset, epoch, record }
    }

    fn data(record: MetadataRecord) -> Record {
        Record::Data(record.encode())
    }

    fn topic(name: &str) -> (Uuid, MetadataRecord) {
        let id = Uuid::new_v4();
        (
            id,
            MetadataRecord::Topic(TopicRecord {
                name: name.to_string(),
                topic_id: id,
            }),
        )
    }

    #[test]
    fn committed_records_make_the_next_image_and_control_records_move_its_offset() {
        let publisher = MetadataPublisher::new();
        let mut machine = MetadataStateMachine::new(publisher.clone());
        let (_, orders) = topic("orders");
        let leader_change = Record::LeaderChange {
            leader_id: 1,
            voters: vec![1],
            granting_voters: vec![1],
        };
        machine
            .apply(&[committed(0, 1, leader_change), committed(1, 1, data(orders))])
            .unwrap();
        assert_eq!(publisher.image().offset, 1);
        assert!(publisher.image().topic("orders").is_some());
        machine.apply(&[committed(2, 2, Record::NoOp)]).unwrap();
        assert_eq!((publisher.image().offset, publisher.image().epoch), (2, 2));
        let (id, _) = machine.snapshot().unwrap();
        assert_eq!(
            id,
            SnapshotId {
                end_offset: 3,
                epoch: 2
            }
        );
    }

    #[test]
    fn replay_stops_at_a_record_it_cannot_decode_keeping_what_came_before() {
        let publisher = MetadataPublisher::new();
        let mut machine = MetadataStateMachine::new(publisher.clone());
        let (_, orders) = topic("orders");
        let (_, payments) = topic("payments");
        // An apiKey this build does not know, version 0.
        let unknown = Record::Data(vec![0x7f, 0x00, 0x00, 0x00]);
        let error = machine
            .apply(&[
                committed(0, 1, data(orders)),
                committed(1, 1, unknown),
                committed(2, 1, data(payments)),
            ])
            .unwrap_err();
        assert!(error.contains("offset 1"), "{error}");
        let image = publisher.image();
        assert_eq!(image.offset, 0);
        assert!(image.topic("orders").is_some() && image.topic("payments").is_none());
    }

    #[test]
    fn a_snapshot_of_the_image_loads_into_the_same_image() {
        let mut machine = MetadataStateMachine::new(MetadataPublisher::new());
        let (id, orders) = topic("orders");
        let partition = MetadataRecord::Partition(PartitionRecord {
            partition_id: 0,
            topic_id: id,
            replicas: vec![1, 2],
            isr: vec![1, 2],
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
        });
        let feature = MetadataRecord::FeatureLevel(FeatureLevelRecord {
            name: "metadata.version".to_string(),
            feature_level: 1,
        });
        machine
            .apply(&[
                committed(0, 1, data(feature)),
                committed(1, 1, data(orders)),
                committed(2, 3, data(partition)),
            ])
            .unwrap();
        let (snapshot_id, records) = machine.snapshot().unwrap();
        let records: Vec<Record> = records.collect();
        let publisher = MetadataPublisher::new();
        let mut other = MetadataStateMachine::new(publisher.clone());
        other.load(snapshot_id, &records).unwrap();
        assert_eq!(publisher.image(), machine.image);
        assert_eq!(publisher.image().fingerprint(), machine.image.fingerprint());
    }
}
