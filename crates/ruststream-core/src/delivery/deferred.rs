//! What a delivery reads from its client's message only when someone asks: headers, and
//! a position with the broker's count of deliveries.

use std::any::Any;
use std::sync::OnceLock;

use bytes::Bytes;

#[cfg(doc)]
use super::Delivery;
use super::{Attempt, Metadata};
use crate::headers::Headers;

/// Headers a transport reads from its client's record only when someone asks for them
/// (librdkafka parses a record's header section on first access, at a cost of about a
/// thousand instructions a record, whether or not it holds any). Given to
/// [`Delivery::set_headers_from`]; the delivery keeps it until it is done with the
/// delivery, or reads it then if it keeps the delivery longer
/// ([`Delivery::own_deferred`]).
pub trait HeaderSource: Send + Sync {
    /// The record's headers, read from the client (once per delivery).
    fn read(&self) -> Headers;

    /// The record's payload, borrowed from the client's message. When this is `Some`,
    /// it is the delivery's payload (whatever the delivery was refilled with): decoding
    /// reads it in place ([`Delivery::payload_slice`]), and a `Bytes` of it is copied
    /// only when someone asks for one ([`Delivery::payload`]) or the delivery is kept
    /// past its handler ([`Delivery::own_deferred`]). `None` (the default): the
    /// delivery's own.
    fn payload(&self) -> Option<&[u8]> {
        None
    }
}

/// A delivery's position ([`Metadata`]) and the broker's count of its deliveries
/// ([`Attempt`]), read from the client's message only when someone asks for them (a
/// JetStream delivery's numbers are in its `$JS.ACK` reply subject, some forty digits to
/// read). Given to [`Delivery::set_position_from`]; kept like a [`HeaderSource`].
pub trait PositionSource: Send + Sync {
    /// The delivery's metadata and attempt, read from the client (once per delivery).
    fn read(&self) -> (Metadata, Attempt);
}

/// What a delivery reads later: its headers, or its position.
pub(super) trait Later: Send + Sync {
    /// The headers; `None`: the delivery's own.
    fn headers(&self) -> Option<Headers>;
    /// The metadata and attempt; `None`: the delivery's own (the attempt the headers'
    /// when they are read later).
    fn position(&self) -> Option<(Metadata, Attempt)>;
    fn reads_headers(&self) -> bool;
    /// The payload, in place; `None`: the delivery's own.
    fn payload(&self) -> Option<&[u8]>;
}

pub(super) struct HeadersLater<S>(pub(super) S);

impl<S: HeaderSource> Later for HeadersLater<S> {
    fn headers(&self) -> Option<Headers> {
        Some(self.0.read())
    }
    fn position(&self) -> Option<(Metadata, Attempt)> {
        None
    }
    fn reads_headers(&self) -> bool {
        true
    }
    fn payload(&self) -> Option<&[u8]> {
        self.0.payload()
    }
}

pub(super) struct PositionLater<S>(pub(super) S);

impl<S: PositionSource> Later for PositionLater<S> {
    fn headers(&self) -> Option<Headers> {
        None
    }
    fn position(&self) -> Option<(Metadata, Attempt)> {
        Some(self.0.read())
    }
    fn reads_headers(&self) -> bool {
        false
    }
    fn payload(&self) -> Option<&[u8]> {
        None
    }
}

/// What was read from a source, each part once, when first asked for.
#[derive(Default)]
pub(super) struct Cells {
    headers: OnceLock<Option<Headers>>,
    position: OnceLock<Option<(Metadata, Attempt)>>,
    pub(super) attempt: OnceLock<Attempt>,
    /// The source's payload, copied once someone asked for a `Bytes` of it.
    payload: OnceLock<Bytes>,
}

impl Cells {
    pub(super) fn is_empty(&self) -> bool {
        self.headers.get().is_none()
            && self.position.get().is_none()
            && self.attempt.get().is_none()
            && self.payload.get().is_none()
    }
}

/// A source and what was read from it, in one box. Done with, the source is let go and
/// the box kept: the delivery's next source of the same kind moves into it, so a box
/// handed back for reuse costs no allocation per message.
pub(super) struct Deferred<L> {
    cells: Cells,
    source: Option<L>,
}

/// A [`Deferred`] of any source, as a delivery holds it.
pub(super) trait Slot: Any + Send + Sync {
    fn cells(&self) -> &Cells;
    fn cells_mut(&mut self) -> &mut Cells;
    /// The source; `None` once let go.
    fn later(&self) -> Option<&dyn Later>;
    /// Lets go of the source and of what was read from it; the box stays.
    fn release(&mut self);
}

impl<L: Later + 'static> Slot for Deferred<L> {
    fn cells(&self) -> &Cells {
        &self.cells
    }
    fn cells_mut(&mut self) -> &mut Cells {
        &mut self.cells
    }
    fn later(&self) -> Option<&dyn Later> {
        self.source.as_ref().map(|source| source as &dyn Later)
    }
    fn release(&mut self) {
        self.source = None;
        // Mostly nothing was read: then there is nothing to clear (a look at each cell
        // costs less than dropping and writing all four).
        if !self.cells.is_empty() {
            self.cells = Cells::default();
        }
    }
}

impl dyn Slot {
    /// `later` in a box: `spare`'s if it held a source of the same kind, else a new one.
    pub(super) fn with<L: Later + 'static>(
        spare: Option<Box<dyn Slot>>,
        later: L,
    ) -> Box<dyn Slot> {
        if let Some(mut spare) = spare
            && let Some(deferred) = (&mut *spare as &mut dyn Any).downcast_mut::<Deferred<L>>()
        {
            deferred.source = Some(later);
            return spare;
        }
        Box::new(Deferred {
            cells: Cells::default(),
            source: Some(later),
        })
    }

    /// The payload in the source, read in place.
    #[inline]
    pub(super) fn payload_in_place(&self) -> Option<&[u8]> {
        self.later()?.payload()
    }

    pub(super) fn reads_headers(&self) -> bool {
        self.later().is_some_and(Later::reads_headers)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn payload(&self) -> Option<&Bytes> {
        let in_place = self.payload_in_place()?;
        Some(
            self.cells()
                .payload
                .get_or_init(|| Bytes::copy_from_slice(in_place)),
        )
    }

    /// The payload as a `Bytes` the caller owns: the copy made earlier, or a new one.
    pub(super) fn take_payload(&mut self) -> Option<Bytes> {
        match self.cells_mut().payload.take() {
            Some(bytes) => Some(bytes),
            None => self.payload_in_place().map(Bytes::copy_from_slice),
        }
    }

    /// The headers as the caller's: those read earlier, or read now.
    pub(super) fn take_headers(&mut self) -> Option<Headers> {
        match self.cells_mut().headers.take() {
            Some(headers) => headers,
            None => self.later().and_then(Later::headers),
        }
    }

    // Out of line: the common delivery has everything at hand.
    #[cold]
    #[inline(never)]
    pub(super) fn headers(&self) -> Option<&Headers> {
        self.cells()
            .headers
            .get_or_init(|| self.later().and_then(Later::headers))
            .as_ref()
    }

    #[cold]
    #[inline(never)]
    pub(super) fn position(&self) -> Option<&(Metadata, Attempt)> {
        self.cells()
            .position
            .get_or_init(|| self.later().and_then(Later::position))
            .as_ref()
    }
}
