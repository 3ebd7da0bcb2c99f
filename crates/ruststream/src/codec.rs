//! Codecs: how message payloads become typed values and back.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Turns payload bytes into values and back. [`Json`] is the default; implement this for
/// another format and use it as `Decoded<T, MyCodec>`.
pub trait Codec: Send + Sync + 'static {
    /// The codec's name, for logs and errors.
    const NAME: &'static str;

    /// Decodes a payload.
    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String>;

    /// Encodes a value.
    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String>;
}

/// JSON through `serde_json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    const NAME: &'static str = "json";

    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
        serde_json::from_slice(payload).map_err(|e| e.to_string())
    }

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String> {
        serde_json::to_vec(value).map_err(|e| e.to_string())
    }
}
