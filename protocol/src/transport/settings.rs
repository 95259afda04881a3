//! The QUIC transport settings of every Fleetmend endpoint, each with its reason: tuned for
//! many connections that carry small messages.

use super::{IDLE_TIMEOUT, KEEP_ALIVE};

/// Bidirectional streams a peer may have open at once on a new connection. An agent's
/// connection carries its one hello-and-reports stream and the coordinator's action requests
/// (one stream per action running on that machine, rarely more than two). quinn keeps a
/// table slot per allowed stream from the start, in its send and its receive map: quinn's
/// default of 100 cost about 8 KiB per agent connection at the coordinator for streams never
/// opened. A peer that wants more waits for a slot; it is never refused.
pub const STREAMS_PER_CONNECTION: u32 = 8;

/// The stream limit once an admin, gateway or coordinator peer's hello is accepted
/// ([`super::PendingHello::accept`]): those connections multiplex requests (`coordinatorctl`
/// scripts, the repair-queue benchmark's 64 requests in flight, a fence storm's power
/// requests to one gateway) and are few, so their slots cost nothing that matters.
pub const MULTIPLEXED_STREAMS: u32 = 256;

/// Per-stream receive window: how much a peer may send on one stream before we read it.
/// The largest agent message is 64 KiB and an action frame 1 MiB; a quarter MiB moves either
/// in a few round trips (a LAN round trip is well under a millisecond) and bounds what a
/// peer whose stream we are slow to read can park in our memory (quinn's default, 1.25 MB
/// per stream, would let 10,000 agents park 12 GB).
pub const STREAM_RECEIVE_WINDOW: u32 = 256 * 1024;

/// Receive window of a whole connection, across its streams: four full stream windows, so
/// an admin client streaming one large answer and a few small requests are not starved
/// (quinn's default is unlimited).
pub const CONNECTION_RECEIVE_WINDOW: u32 = 4 * STREAM_RECEIVE_WINDOW;

/// Unacknowledged data we keep per connection for sending: the coordinator's answers are
/// acks and admin replies (up to 32 MiB exports, written in pieces as the window allows);
/// one MiB keeps a LAN link busy and bounds what a peer that stops acknowledging costs
/// (quinn's default is 10 MB).
pub const SEND_WINDOW: u64 = 1024 * 1024;

/// The QUIC transport settings every Fleetmend endpoint uses, tuned for many connections
/// carrying small messages: few stream slots, bounded windows, no unreliable datagrams
/// (no component sends one, so none are buffered), and no path MTU discovery (every agent
/// message fits the 1200-byte minimum packet; probing would cost each of 10,000 connections
/// several packets every ten minutes and a larger send buffer).
///
/// A server (the coordinator, a gateway) also asks its clients to acknowledge every packet
/// that needs it at once ([`immediate_acks`]).
pub(super) fn transport_config(server: bool) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(
        IDLE_TIMEOUT.try_into().expect("idle timeout fits a VarInt"),
    ));
    t.keep_alive_interval(Some(KEEP_ALIVE));
    t.max_concurrent_bidi_streams(STREAMS_PER_CONNECTION.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.stream_receive_window(STREAM_RECEIVE_WINDOW.into());
    t.receive_window(CONNECTION_RECEIVE_WINDOW.into());
    t.send_window(SEND_WINDOW);
    t.datagram_receive_buffer_size(None);
    t.datagram_send_buffer_size(0);
    t.mtu_discovery_config(None);
    if server {
        t.ack_frequency_config(Some(immediate_acks()));
    }
    t
}

/// What a server asks of its clients' acknowledgements (the QUIC acknowledgement frequency
/// extension, which every Fleetmend endpoint speaks: quinn advertises it): acknowledge every
/// packet that needs one at once, rather than every second one or after up to 25 ms.
///
/// For an agent this saves a wakeup per report. Its report round is one packet each way: the
/// report, then the coordinator's reply. By default the agent acknowledges the reply 25 ms
/// later (RFC 9000's `max_ack_delay`), which wakes it once more per report for one small
/// packet; asked to acknowledge at once, it sends that packet while still handling the reply
/// (`strace -p` of an agent shows the timer wakeup gone). The acknowledgement packet itself
/// stays: the extension lets a sender ask for a delay of at most 25 ms or the round-trip time,
/// never the minutes until the next report. The clients' own requests of the server are left
/// at the default: a coordinator acknowledging every report at once would send the
/// acknowledgement before its reply instead of inside it, one more packet per report.
/// Bulk transfers to a client (a `coordinatorctl` export) cost one acknowledgement per
/// packet instead of one per two, on a LAN.
pub fn immediate_acks() -> quinn::AckFrequencyConfig {
    let mut a = quinn::AckFrequencyConfig::default();
    a.ack_eliciting_threshold(0u32.into());
    a
}
