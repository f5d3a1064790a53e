//! Protobuf: the registry's `.proto` text compiled in-process (protox: no `protoc` needed), the
//! plugin's JSON read with the proto3 JSON mapping (prost-reflect) and encoded, and the message
//! index list Confluent's framing puts before the bytes.

use prost_reflect::prost::Message as _;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// The name the schema's own file gets while compiling (imports of the well-known types, such
/// as `google/protobuf/timestamp.proto`, resolve to protox's copies).
const SCHEMA_FILE: &str = "schema.proto";

/// One message type of a compiled `.proto` schema.
#[derive(Debug)]
pub struct ProtoSchema {
    message: MessageDescriptor,
    /// Where the message sits in the file: `[2]` is the third top-level message, `[0, 1]` the
    /// second message nested in the first.
    indexes: Vec<i32>,
}

/// The schema's text as the file `schema.proto`.
struct Source(String);

impl FileResolver for Source {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == SCHEMA_FILE {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

impl ProtoSchema {
    /// Compiles schema text and picks `record` (a full name, with or without the package), or
    /// the file's first message.
    pub fn parse(text: &str, record: Option<&str>) -> Result<Self, String> {
        let mut resolver = ChainFileResolver::new();
        resolver.add(Source(text.to_owned()));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler
            .open_file(SCHEMA_FILE)
            .map_err(|e| format!("not a Protobuf schema: {e}"))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(SCHEMA_FILE)
            .ok_or_else(|| "not a Protobuf schema: the file did not compile".to_owned())?;
        let message = match record {
            Some(name) => {
                let qualified = match file.package_name() {
                    "" => name.to_owned(),
                    package if name.starts_with(&format!("{package}.")) => name.to_owned(),
                    package => format!("{package}.{name}"),
                };
                pool.get_message_by_name(&qualified)
                    .filter(|m| m.parent_file().name() == SCHEMA_FILE)
                    .ok_or_else(|| format!("the Protobuf schema has no message {name}"))?
            }
            None => file
                .messages()
                .next()
                .ok_or_else(|| "the Protobuf schema declares no message".to_owned())?,
        };
        let indexes = indexes(&message);
        Ok(Self { message, indexes })
    }

    /// The message's full name.
    pub fn full_name(&self) -> &str {
        self.message.full_name()
    }

    /// Confluent's message-index list for this message.
    pub fn indexes(&self) -> &[i32] {
        &self.indexes
    }

    /// Protobuf binary of the JSON `payload` (proto3 JSON mapping; unknown fields refused),
    /// or why it does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let mut json = serde_json::Deserializer::from_slice(payload);
        let message = DynamicMessage::deserialize_with_options(
            self.message.clone(),
            &mut json,
            &DeserializeOptions::new(),
        )
        .map_err(|e| format!("does not fit message {}: {e}", self.message.full_name()))?;
        json.end().map_err(|e| format!("not one JSON value: {e}"))?;
        Ok(message.encode_to_vec())
    }
}

/// The path of indexes from the file down to `message`.
fn indexes(message: &MessageDescriptor) -> Vec<i32> {
    let mut path = Vec::new();
    let mut current = message.clone();
    loop {
        let siblings: Vec<MessageDescriptor> = match current.parent_message() {
            Some(parent) => parent.child_messages().collect(),
            None => current.parent_file().messages().collect(),
        };
        let at = siblings
            .iter()
            .position(|m| m.full_name() == current.full_name())
            .unwrap_or(0);
        path.push(at as i32);
        match current.parent_message() {
            Some(parent) => current = parent,
            None => break,
        }
    }
    path.reverse();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"
        syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        message Order {
            int64 id = 1;
            string customer = 2;
            google.protobuf.Timestamp at = 3;
            message Line { string sku = 1; int32 qty = 2; }
            repeated Line lines = 4;
        }
        message Refund { int64 order_id = 1; }
    "#;

    #[test]
    fn the_first_message_is_picked_unless_a_record_is_named() {
        let first = ProtoSchema::parse(SHOP, None).unwrap();
        assert_eq!(first.full_name(), "shop.Order");
        assert_eq!(first.indexes(), [0]);
        let refund = ProtoSchema::parse(SHOP, Some("Refund")).unwrap();
        assert_eq!(refund.full_name(), "shop.Refund");
        assert_eq!(refund.indexes(), [1]);
        let line = ProtoSchema::parse(SHOP, Some("shop.Order.Line")).unwrap();
        assert_eq!(line.indexes(), [0, 0]);
        let missing = ProtoSchema::parse(SHOP, Some("Shipment")).unwrap_err();
        assert_eq!(missing, "the Protobuf schema has no message Shipment");
    }

    #[test]
    fn json_is_read_with_the_proto3_mapping() {
        let order = ProtoSchema::parse(SHOP, None).unwrap();
        let bytes = order
            .encode(br#"{"id": "7", "customer": "c", "lines": [{"sku": "A", "qty": 2}]}"#)
            .unwrap();
        // id: field 1 varint 7; customer: field 2 len 1 "c"; lines: field 4 len 5 {sku, qty}.
        assert_eq!(
            bytes,
            [0x08, 7, 0x12, 1, b'c', 0x22, 5, 0x0a, 1, b'A', 0x10, 2]
        );
        let unknown = order.encode(br#"{"id": 1, "colour": "red"}"#).unwrap_err();
        assert!(unknown.contains("colour"), "{unknown}");
        let wrong = order.encode(br#"{"id": "seven"}"#).unwrap_err();
        assert!(
            wrong.starts_with("does not fit message shop.Order"),
            "{wrong}"
        );
    }

    #[test]
    fn a_broken_schema_says_so() {
        let e = ProtoSchema::parse("message {", None).unwrap_err();
        assert!(e.starts_with("not a Protobuf schema"), "{e}");
    }
}
