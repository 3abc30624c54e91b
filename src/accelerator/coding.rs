//! What a coded response is coded with ([`Coding`]): the encoder and the
//! shares it draws on (CPU turns, transfer memory, the basis store, the
//! counters, and where a streamed body may be parked, [`Parking`]). The role
//! fills it once it has decided to code; the whole-body and streamed
//! encoders take it apart.

use std::sync::Arc;

use crate::feed::primary::FeedCommit;
use crate::hsync::Encoder;
use crate::http::access_log::Note;
use crate::http::body_pipe::Parking;
use crate::http::transfer_memory::TransferMemory;

use super::basis_store::{BasisStore, ServedAs};
use super::stats::Stats;
use super::turns::Encoders;

/// What a coded response is coded with.
pub(super) struct Coding {
    pub(super) encoder: Encoder,
    pub(super) encoders: Encoders,
    /// The budget a streamed coding takes its share of, that share, and
    /// the body's announced length.
    pub(super) memory: Option<(TransferMemory, u64, Option<u64>)>,
    /// Where the body is kept once coded, if it may be.
    pub(super) store: Option<Arc<BasisStore>>,
    /// What names the body before its bytes come, for the store: a
    /// streamed body held already under that name is not copied again.
    pub(super) served_as: Option<ServedAs>,
    pub(super) stats: Arc<Stats>,
    /// Where a streamed body is parked if its client stops reading
    /// ([`AcceleratorConfig::spool_dir`](super::AcceleratorConfig::spool_dir),
    /// `max_spool`; `None`: never).
    pub(super) parking: Option<Parking>,
    /// The request's access log note, told the coding's figures at its end.
    pub(super) note: Option<Note>,
    /// The site's change feed, told the body's digest once it is whole.
    pub(super) feed: Option<FeedCommit>,
}
