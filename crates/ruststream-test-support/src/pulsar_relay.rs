//! A frame relay between the Rust `pulsar` client and pulsar-lite (tests, benchmarks and
//! fault services reach the broker through it).
//!
//! Why: the Pulsar binary protocol lets a broker send message frames without the
//! optional "magic number + CRC32C" section (the Java and C++ clients accept both), and
//! pulsar-lite does so; the Rust client always expects the section and fails to decode
//! every message. This relay sits on a local port, passes everything from client to
//! broker unchanged, and inserts the section (magic `0x0e01` and the CRC32C of the rest
//! of the frame, as the protocol defines it) into broker-to-client frames that carry a
//! payload without one. Nothing else changes; no copy of the client crate is involved.
//!
//! Frame layout: `total_size:u32 | command_size:u32 | command | [magic:u16 | crc:u32] |
//! metadata_size:u32 | metadata | payload`, big endian; the CRC covers everything after
//! it.
//!
//! A watched relay ([`start_watched`]) also notes the type of each command a client
//! sends (a test sees when a nack went out), passing the frames on unchanged.
//!
//! Topic lookups answer with the broker's own address, which would send the client around
//! the relay. The relay listens on an address of the same length as the broker's and
//! writes its own address over the broker's in those answers, so no length field of the
//! encoded command changes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

const MAGIC: [u8; 2] = [0x0e, 0x01];

/// Starts a relay to `broker` (`host:port`) on a free local port whose address is as
/// long as the broker's; returns its address.
pub async fn start(broker: String) -> SocketAddr {
    let listener = bind_like(&broker).await;
    serve(listener, broker, None)
}

/// The `type` of Pulsar's `BaseCommand` a client sends to have messages delivered again
/// (a nack).
pub const REDELIVER_UNACKNOWLEDGED_MESSAGES: u64 = 20;

/// The commands clients sent through a watched relay: when, and of which `type`.
#[derive(Clone, Default)]
pub struct Sent(Arc<Mutex<Vec<(Instant, u64)>>>);

impl Sent {
    /// When each command of type `kind` passed, in order.
    pub fn times(&self, kind: u64) -> Vec<Instant> {
        let sent = self.0.lock().expect("not poisoned");
        sent.iter()
            .filter(|(_, k)| *k == kind)
            .map(|(at, _)| *at)
            .collect()
    }
}

/// Like [`start`], also noting the type of every command clients send.
pub async fn start_watched(broker: String) -> (SocketAddr, Sent) {
    let listener = bind_like(&broker).await;
    let sent = Sent::default();
    (serve(listener, broker, Some(sent.clone())), sent)
}

/// Like [`start`], but nothing listens on the returned address until `after` passed (a
/// broker that comes up late).
pub async fn start_later(broker: String, after: std::time::Duration) -> SocketAddr {
    let address = bind_like(&broker)
        .await
        .local_addr()
        .expect("relay address");
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let listener = TcpListener::bind(address)
            .await
            .expect("bind the late relay");
        serve(listener, broker, None);
    });
    address
}

fn serve(listener: TcpListener, broker: String, sent: Option<Sent>) -> SocketAddr {
    let address = listener.local_addr().expect("relay address");
    let from = format!("pulsar://{broker}").into_bytes();
    let to = format!("pulsar://{address}").into_bytes();
    assert_eq!(
        from.len(),
        to.len(),
        "the relay's address must be as long as the broker's"
    );
    let urls = Arc::new((from, to));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let broker = broker.clone();
            let urls = Arc::clone(&urls);
            let sent = sent.clone();
            tokio::spawn(async move {
                let Ok(upstream) = TcpStream::connect(&broker).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let (client_read, mut client_write) = client.into_split();
                let (mut upstream_read, upstream_write) = upstream.into_split();
                match sent {
                    None => tokio::spawn(pass_through(client_read, upstream_write)),
                    Some(sent) => tokio::spawn(watch_through(client_read, upstream_write, sent)),
                };
                let _ =
                    add_checksums(&mut upstream_read, &mut client_write, &urls.0, &urls.1).await;
            });
        }
    });
    address
}

async fn pass_through(mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Passes frames on whole, noting each command's type: the `BaseCommand`'s field 1 (a
/// varint), which its encoding writes first.
async fn watch_through(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, sent: Sent) {
    let mut frame = Vec::new();
    while let Ok(total) = from.read_u32().await {
        frame.resize(total as usize, 0);
        if from.read_exact(&mut frame).await.is_err() {
            break;
        }
        if let Some(kind) = command_type(&frame) {
            let mut seen = sent.0.lock().expect("not poisoned");
            seen.push((Instant::now(), kind));
        }
        if to.write_u32(total).await.is_err() || to.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The `type` of the command in `frame` (after its total size).
fn command_type(frame: &[u8]) -> Option<u64> {
    let command = frame.get(4..)?;
    if command.first() != Some(&0x08) {
        return None;
    }
    let mut kind = 0u64;
    for (i, byte) in command[1..].iter().take(10).enumerate() {
        kind |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(kind);
        }
    }
    None
}

/// Binds 127.0.0.1 on a port with as many digits as `broker`'s.
async fn bind_like(broker: &str) -> TcpListener {
    let digits = broker.rsplit(':').next().map_or(5, str::len);
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        if listener
            .local_addr()
            .expect("address")
            .port()
            .to_string()
            .len()
            == digits
        {
            return listener;
        }
        if digits == 4 {
            for port in 2000..9999u16 {
                if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
                    return listener;
                }
            }
        }
    }
    panic!("no free port with {digits} digits for the relay");
}

async fn add_checksums(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    broker_url: &[u8],
    relay_url: &[u8],
) -> std::io::Result<()> {
    loop {
        let total = from.read_u32().await? as usize;
        let mut frame = vec![0u8; total];
        from.read_exact(&mut frame).await?;
        let command_size = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        let rest = 4 + command_size;
        // Lookup answers name the broker: point them at the relay instead.
        if let Some(at) = frame[4..rest]
            .windows(broker_url.len())
            .position(|w| w == broker_url)
        {
            frame[4 + at..4 + at + relay_url.len()].copy_from_slice(relay_url);
        }
        if frame.len() > rest && frame[rest..rest + 2] != MAGIC {
            let checksum = crc32c(&frame[rest..]);
            let mut fixed = Vec::with_capacity(frame.len() + 6);
            fixed.extend_from_slice(&frame[..rest]);
            fixed.extend_from_slice(&MAGIC);
            fixed.extend_from_slice(&checksum.to_be_bytes());
            fixed.extend_from_slice(&frame[rest..]);
            frame = fixed;
        }
        to.write_u32(frame.len() as u32).await?;
        to.write_all(&frame).await?;
    }
}

/// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78.
fn crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut crc = i as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
            *entry = crc;
        }
        table
    });
    !data.iter().fold(!0u32, |crc, &b| {
        table[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
#[test]
fn a_commands_type_is_read_from_its_first_field() {
    // total size left out; command size 4; type 20 (one byte), then another field.
    assert_eq!(
        command_type(&[0, 0, 0, 4, 0x08, 20, 0xa2, 0x01]),
        Some(REDELIVER_UNACKNOWLEDGED_MESSAGES)
    );
    // A type of two varint bytes (300 = 0b10_0101100).
    assert_eq!(command_type(&[0, 0, 0, 3, 0x08, 0xac, 0x02]), Some(300));
    assert_eq!(command_type(&[0, 0, 0, 2, 0x10, 1]), None, "not field 1");
}

#[cfg(test)]
#[test]
fn crc32c_matches_the_standard_check_value() {
    // The check value of CRC-32C for "123456789".
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
}
