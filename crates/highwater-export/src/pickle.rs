//! Just enough of Python's pickle format (protocol 2) to write nested dicts, lists, strings and
//! integers, readable by `pickle.load` and by PyTorch's memory viewer.

/// A value to pickle.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Str(String),
    List(Vec<Value>),
    /// Keys are strings, in this order.
    Dict(Vec<(&'static str, Value)>),
}

// Opcodes (Python's `pickletools` names).
const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';

/// Items per MARK…APPENDS/SETITEMS batch, as Python's own pickler does, so readers that spread
/// a batch into a call's arguments stay within their limits.
const BATCH: usize = 1000;

/// Pickles `value` (protocol 2).
pub(crate) fn dumps(value: &Value) -> Vec<u8> {
    let mut out = vec![PROTO, 2];
    write(value, &mut out);
    out.push(STOP);
    out
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Int(n) => write_int(*n, out),
        Value::Str(s) => write_str(s, out),
        Value::List(items) => {
            out.push(EMPTY_LIST);
            for batch in items.chunks(BATCH) {
                out.push(MARK);
                batch.iter().for_each(|item| write(item, out));
                out.push(APPENDS);
            }
        }
        Value::Dict(entries) => {
            out.push(EMPTY_DICT);
            for batch in entries.chunks(BATCH) {
                out.push(MARK);
                for (key, item) in batch {
                    write_str(key, out);
                    write(item, out);
                }
                out.push(SETITEMS);
            }
        }
    }
}

fn write_str(text: &str, out: &mut Vec<u8>) {
    out.push(BINUNICODE);
    out.extend((text.len() as u32).to_le_bytes());
    out.extend(text.as_bytes());
}

fn write_int(n: i64, out: &mut Vec<u8>) {
    match n {
        0..=0xFF => out.extend([BININT1, n as u8]),
        0x100..=0xFFFF => {
            out.push(BININT2);
            out.extend((n as u16).to_le_bytes());
        }
        _ if i32::try_from(n).is_ok() => {
            out.push(BININT);
            out.extend((n as i32).to_le_bytes());
        }
        _ => {
            // Little-endian two's complement, shortest form that keeps the sign.
            let bytes = n.to_le_bytes();
            let mut len = 8;
            while len > 1 {
                let top = bytes[len - 1];
                let next_sign = bytes[len - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xFF && next_sign != 0) {
                    len -= 1;
                } else {
                    break;
                }
            }
            out.extend([LONG1, len as u8]);
            out.extend(&bytes[..len]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_the_shortest_opcode() {
        let pickled = |n| {
            let mut out = Vec::new();
            write_int(n, &mut out);
            out
        };
        assert_eq!(pickled(7), vec![BININT1, 7]);
        assert_eq!(pickled(0x1234), vec![BININT2, 0x34, 0x12]);
        assert_eq!(pickled(-1), vec![BININT, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(pickled(1 << 40), vec![LONG1, 6, 0, 0, 0, 0, 0, 1]);
        assert_eq!(pickled(0x80_0000_0000), vec![LONG1, 6, 0, 0, 0, 0, 0x80, 0]);
    }

    #[test]
    fn containers_are_batched() {
        let list = Value::List((0..2500).map(|_| Value::Int(1)).collect());
        let bytes = dumps(&list);
        assert_eq!(bytes.iter().filter(|&&b| b == APPENDS).count(), 3);
        assert_eq!(&bytes[..3], &[PROTO, 2, EMPTY_LIST]);
        assert_eq!(bytes.last(), Some(&STOP));
    }
}
