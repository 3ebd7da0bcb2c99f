//! Codecs: how message payloads become typed values and back.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A codec's failure: the format library's own error, kept as a value so it stays
/// reachable through `source()`.
type CodecError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Turns payload bytes into values and back. [`Json`] is the default; implement this for
/// another format and use it as `Decoded<T, MyCodec>`.
pub trait Codec: Send + Sync + 'static {
    /// The codec's name, for logs and errors.
    const NAME: &'static str;

    /// Decodes a payload.
    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError>;

    /// Encodes a value.
    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError>;
}

/// JSON through `serde_json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    const NAME: &'static str = "json";

    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(payload).map_err(Into::into)
    }

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(Into::into)
    }
}
