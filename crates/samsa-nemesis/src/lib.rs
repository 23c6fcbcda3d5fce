//! samsa's nemesis: faults for a cluster run with Docker Compose
//! (`deploy/compose.yaml`), for the container tests and for users
//! (`samsa nemesis`, docs/RELIABILITY.md).
//!
//! - [`schedule`]: the pure, seeded schedule of faults;
//! - [`compose`]: the faults on a compose project's containers and their
//!   heal (SIGKILL, pause, iptables partitions and loss, tc delay, a full
//!   disk);
//! - [`roles`]: which node leads a partition or the quorum now;
//! - [`run`]: a schedule run against a project, with the fault log
//!   ([`log`]) `samsa verify --faults` reads;
//! - [`cli`]: the `samsa nemesis` subcommand.
//!
//! Everything shells out to `docker`, `nsenter`, `iptables` and `tc` on the
//! host, so it needs root; it changes nothing inside the image.

pub mod cli;
pub mod compose;
pub mod error;
pub mod log;
pub mod roles;
pub mod run;
pub mod schedule;

pub use compose::{ActiveFault, ComposeProject, Nemesis};
pub use error::NemesisError;
pub use log::{FaultLog, FaultRecord};
pub use roles::{KafkaRoles, Roles};
pub use schedule::{FaultKind, ScheduleParams, Step, Target};
