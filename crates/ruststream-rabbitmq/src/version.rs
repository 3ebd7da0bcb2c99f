//! The broker's version, which decides a quorum queue's delivery limit: RabbitMQ 4.0
//! and later give a quorum queue without `x-delivery-limit` a limit of 20, and read `-1`
//! as no limit; 3.x has no default and drops a message after its first delivery with
//! `-1`. lapin does not keep what the broker says of itself, so it is read here from the
//! broker's first frame (`connection.start`, whose server properties carry `version`)
//! on a plain connection of its own, closed at once.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::{AMQPScheme, AMQPUri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The broker's (major, minor) version, or `None` when it cannot be read: an `amqps://`
/// URL (the TLS handshake is lapin's), no answer within `timeout`, an unexpected frame.
pub(crate) async fn server_version(url: &str, timeout: Duration) -> Option<(u32, u32)> {
    let uri: AMQPUri = url.parse().ok()?;
    if uri.scheme == AMQPScheme::AMQPS {
        return None;
    }
    let address = (uri.authority.host.as_str(), uri.authority.port);
    let reading = async {
        let mut socket = tokio::net::TcpStream::connect(address).await.ok()?;
        socket.write_all(b"AMQP\x00\x00\x09\x01").await.ok()?;
        let mut header = [0_u8; 7];
        socket.read_exact(&mut header).await.ok()?;
        let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
        let mut payload = vec![0_u8; usize::try_from(size).ok()?.min(1 << 20)];
        socket.read_exact(&mut payload).await.ok()?;
        (header[0] == 1).then_some(payload)
    };
    let payload = tokio::time::timeout(timeout, reading).await.ok()??;
    start_version(&payload)
}

/// The version in a `connection.start` method's payload: class 10, method 10, the
/// protocol's major and minor, then the server properties.
fn start_version(payload: &[u8]) -> Option<(u32, u32)> {
    if payload.get(..4)? != [0, 10, 0, 10] {
        return None;
    }
    let (_, properties): (_, FieldTable) =
        lapin::types::parsing::parse_field_table(payload.get(6..)?).ok()?;
    let AMQPValue::LongString(version) = properties.inner().get("version")? else {
        return None;
    };
    let text = String::from_utf8_lossy(version.as_bytes()).into_owned();
    let mut parts = text.split('.').map(|p| p.parse::<u32>());
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

    use super::{server_version, start_version};

    /// Against the broker the test command started (RabbitMQ 3.10 from Debian): the
    /// version it tells in its first frame.
    #[tokio::test]
    async fn r5_the_brokers_version_is_read_from_its_first_frame() {
        let url = std::env::var("RUSTSTREAM_RABBITMQ_URL").unwrap_or_else(|_| {
            panic!("RUSTSTREAM_RABBITMQ_URL is not set: run the tests with scripts/test, which starts rabbitmq-server")
        });
        let version = server_version(&url, std::time::Duration::from_secs(5)).await;
        let (major, minor) = version.expect("the broker tells its version");
        assert!(major >= 3 && (major > 3 || minor >= 8), "{major}.{minor}");
    }

    #[test]
    fn the_version_is_read_from_connection_start() {
        let mut properties = FieldTable::default();
        properties.insert(
            ShortString::from("product"),
            AMQPValue::LongString(LongString::from("RabbitMQ")),
        );
        properties.insert(
            ShortString::from("version"),
            AMQPValue::LongString(LongString::from("4.1.3")),
        );
        let encoded = lapin::types::generation::gen_field_table(&properties)(Vec::new().into())
            .expect("encoded");
        let mut payload = vec![0, 10, 0, 10, 0, 9];
        payload.extend_from_slice(&encoded.write);
        assert_eq!(start_version(&payload), Some((4, 1)));
        assert_eq!(start_version(&[0, 10, 0, 11, 0, 9]), None);
    }
}
