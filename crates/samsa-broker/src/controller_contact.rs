//! [`ControllerContact`]: when this broker last heard the active controller
//! answer a heartbeat unfenced, and whether that is too long ago for the broker to
//! trust the leaderships its (possibly stale) metadata gives it.
//!
//! Why: a leader cut off from the controller majority and from its
//! followers keeps its old metadata. The controller fences it after
//! `broker_session_timeout_ms` and elects another leader, but clients that
//! still reach the cut-off node would be told it leads and wait out their
//! request timeouts there. Once contact is lost for a session timeout, a
//! leader whose in-sync followers are all silent for as long treats its
//! leadership as in doubt (`Partition::leadership_in_doubt_now`): it refuses
//! produce and fetch with NOT_LEADER_OR_FOLLOWER and names no leader in
//! Metadata, so clients go to the brokers that know the new leader.
//!
//! Invariants: a broker without a controller quorum (single node) never
//! loses contact; a cluster broker counts its start as the last contact, so
//! it is not in doubt before its first heartbeat had a chance.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// `session_timeout_ms` value of a broker that has no controller.
const NO_CONTROLLER: i64 = 0;

/// The last answered heartbeat (wall-clock ms, as [`crate::now_ms`]).
#[derive(Debug)]
pub struct ControllerContact {
    session_timeout_ms: AtomicI64,
    last_heard_ms: AtomicI64,
}

impl ControllerContact {
    /// A broker with no controller quorum: contact is never lost.
    pub fn standalone() -> Self {
        Self {
            session_timeout_ms: AtomicI64::new(NO_CONTROLLER),
            last_heard_ms: AtomicI64::new(0),
        }
    }

    /// Cluster mode: contact is lost `session_timeout` after the last
    /// answered heartbeat; `now_ms` counts as the first.
    pub fn follow_controller(&self, session_timeout: Duration, now_ms: i64) {
        self.last_heard_ms.store(now_ms, Ordering::Release);
        let timeout = i64::try_from(session_timeout.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        self.session_timeout_ms.store(timeout, Ordering::Release);
    }

    /// The active controller answered a heartbeat at `now_ms`, unfenced.
    pub fn heard(&self, now_ms: i64) {
        self.last_heard_ms.fetch_max(now_ms, Ordering::AcqRel);
    }

    /// `Some(session timeout in ms)` when contact is lost at `now_ms`:
    /// no heartbeat answered for longer than the session timeout.
    pub fn lost(&self, now_ms: i64) -> Option<i64> {
        let timeout = self.session_timeout_ms.load(Ordering::Acquire);
        if timeout == NO_CONTROLLER {
            return None;
        }
        let silent = now_ms.saturating_sub(self.last_heard_ms.load(Ordering::Acquire));
        (silent > timeout).then_some(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_without_a_controller_never_loses_contact() {
        let contact = ControllerContact::standalone();
        assert_eq!(contact.lost(i64::MAX), None);
    }

    #[test]
    fn contact_is_lost_one_session_after_the_last_answer() {
        let contact = ControllerContact::standalone();
        contact.follow_controller(Duration::from_millis(9_000), 1_000);
        assert_eq!(contact.lost(10_000), None, "start counts as contact");
        assert_eq!(contact.lost(10_001), Some(9_000));
        contact.heard(10_001);
        assert_eq!(contact.lost(19_001), None);
        // An older answer recorded late does not move contact back.
        contact.heard(5_000);
        assert_eq!(contact.lost(19_001), None);
        assert_eq!(contact.lost(19_002), Some(9_000));
    }
}
