//! Confluent's wire format: magic byte 0, the schema id as 4 big-endian bytes, then (Protobuf
//! only) the message-index list, then the encoded data. Every Confluent deserializer (Java,
//! confluent-kafka-python, librdkafka-based clients) reads this.

/// The first byte of every framed message.
pub const MAGIC: u8 = 0;

/// `data` framed for schema `id`; `indexes` is the Protobuf message-index list (`None`: Avro
/// and JSON Schema, which have none).
pub fn frame(id: u32, indexes: Option<&[i32]>, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + 4 + data.len());
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    match indexes {
        None => {}
        // The common case, the file's first message, is written as a single 0.
        Some([0]) => out.push(0),
        Some(path) => {
            zigzag_varint(path.len() as i64, &mut out);
            for &i in path {
                zigzag_varint(i64::from(i), &mut out);
            }
        }
    }
    out.extend_from_slice(data);
    out
}

fn zigzag_varint(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_magic_id_then_indexes() {
        assert_eq!(frame(258, None, b"x"), [0, 0, 0, 1, 2, b'x']);
        assert_eq!(frame(1, Some(&[0]), b""), [0, 0, 0, 0, 1, 0]);
        // [1]: count 1 → 2, index 1 → 2; [0, 70]: count 2 → 4, 0 → 0, 70 → 140 (two bytes).
        assert_eq!(frame(1, Some(&[1]), b""), [0, 0, 0, 0, 1, 2, 2]);
        assert_eq!(
            frame(1, Some(&[0, 70]), b""),
            [0, 0, 0, 0, 1, 4, 0, 0x8c, 0x01]
        );
    }
}
