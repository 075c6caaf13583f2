//! The messages of pprof's `profile.proto` (package `perftools.profiles`) that the export
//! writes, with their `prost::Message` implementations written out here rather than generated:
//! no build script, no `protoc`, and no proc-macro (prost's derive pulls `anyhow` into the
//! library's dependency tree, which the library must not have).
//!
//! Field numbers and types are the schema's; every string field is an index into
//! [`Profile::string_table`], whose entry 0 is `""`. Proto3 rules apply: a scalar equal to its
//! default is not written, repeated scalars are packed.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// Whether a scalar holds its default, which proto3 does not write.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Encodes, merges and sizes one field of a message by its kind (see [`message!`]).
macro_rules! field {
    (encode, scalar $kind:ident, $tag:expr, $value:expr, $buf:expr) => {
        if !is_default($value) {
            encoding::$kind::encode($tag, $value, $buf)
        }
    };
    (encode, packed $kind:ident, $tag:expr, $value:expr, $buf:expr) => {
        encoding::$kind::encode_packed($tag, $value, $buf)
    };
    (encode, repeated $kind:ident, $tag:expr, $value:expr, $buf:expr) => {
        encoding::$kind::encode_repeated($tag, $value, $buf)
    };
    (encode, optional message, $tag:expr, $value:expr, $buf:expr) => {
        if let Some(value) = $value {
            encoding::message::encode($tag, value, $buf)
        }
    };
    (merge, scalar $kind:ident, $wire:expr, $value:expr, $buf:expr, $ctx:expr) => {
        encoding::$kind::merge($wire, $value, $buf, $ctx)
    };
    (merge, packed $kind:ident, $wire:expr, $value:expr, $buf:expr, $ctx:expr) => {
        encoding::$kind::merge_repeated($wire, $value, $buf, $ctx)
    };
    (merge, repeated $kind:ident, $wire:expr, $value:expr, $buf:expr, $ctx:expr) => {
        encoding::$kind::merge_repeated($wire, $value, $buf, $ctx)
    };
    (merge, optional message, $wire:expr, $value:expr, $buf:expr, $ctx:expr) => {
        encoding::message::merge(
            $wire,
            $value.get_or_insert_with(Default::default),
            $buf,
            $ctx,
        )
    };
    (len, scalar $kind:ident, $tag:expr, $value:expr) => {
        if !is_default($value) {
            encoding::$kind::encoded_len($tag, $value)
        } else {
            0
        }
    };
    (len, packed $kind:ident, $tag:expr, $value:expr) => {
        encoding::$kind::encoded_len_packed($tag, $value)
    };
    (len, repeated $kind:ident, $tag:expr, $value:expr) => {
        encoding::$kind::encoded_len_repeated($tag, $value)
    };
    (len, optional message, $tag:expr, $value:expr) => {
        $value
            .as_ref()
            .map_or(0, |value| encoding::message::encoded_len($tag, value))
    };
}

/// Declares a message struct and implements `prost::Message` for it from its field list:
/// `tag => name: how kind as Type`, where `how` is `scalar`, `packed`, `repeated` or
/// `optional` and `kind` names the `prost::encoding` module of the wire type.
macro_rules! message {
    ($(#[$doc:meta])* $name:ident {
        $($(#[$field_doc:meta])* $tag:literal => $field:ident: $how:ident $kind:ident as $ty:ty,)*
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: $ty,)*
        }

        impl prost::Message for $name {
            fn encode_raw(&self, buf: &mut impl BufMut) {
                $(field!(encode, $how $kind, $tag, &self.$field, buf);)*
            }

            fn merge_field(
                &mut self,
                tag: u32,
                wire_type: WireType,
                buf: &mut impl Buf,
                ctx: DecodeContext,
            ) -> Result<(), DecodeError> {
                match tag {
                    $($tag => field!(merge, $how $kind, wire_type, &mut self.$field, buf, ctx),)*
                    _ => encoding::skip_field(wire_type, tag, buf, ctx),
                }
            }

            fn encoded_len(&self) -> usize {
                0 $(+ field!(len, $how $kind, $tag, &self.$field))*
            }

            fn clear(&mut self) {
                *self = Self::default();
            }
        }
    };
}

message! {
    /// A whole profile.
    Profile {
        /// What each value of a sample measures.
        1 => sample_type: repeated message as Vec<ValueType>,
        /// The samples.
        2 => sample: repeated message as Vec<Sample>,
        /// Binaries mapped into the process.
        3 => mapping: repeated message as Vec<Mapping>,
        /// Code locations that samples refer to.
        4 => location: repeated message as Vec<Location>,
        /// Functions that locations refer to.
        5 => function: repeated message as Vec<Function>,
        /// Every string of the profile; entry 0 is `""`.
        6 => string_table: repeated string as Vec<String>,
        /// Wall-clock start, ns since the Unix epoch.
        9 => time_nanos: scalar int64 as i64,
        /// Length of the profiled run, ns.
        10 => duration_nanos: scalar int64 as i64,
        /// What the sampling period counts.
        11 => period_type: optional message as Option<ValueType>,
        /// The sampling period (here: mean bytes between samples).
        12 => period: scalar int64 as i64,
        /// Free-text notes (string indices).
        13 => comment: packed int64 as Vec<i64>,
        /// The sample type viewers show first (a string index into the type names).
        14 => default_sample_type: scalar int64 as i64,
    }
}

message! {
    /// A measured quantity: its name and unit (string indices).
    ValueType {
        /// `inuse_space`, `alloc_objects`, …
        1 => r#type: scalar int64 as i64,
        /// `bytes`, `count`.
        2 => unit: scalar int64 as i64,
    }
}

message! {
    /// One stack with its values and labels.
    Sample {
        /// Location ids, the leaf first.
        1 => location_id: packed uint64 as Vec<u64>,
        /// One value per [`Profile::sample_type`].
        2 => value: packed int64 as Vec<i64>,
        /// Labels (`category`, `span`, `op`).
        3 => label: repeated message as Vec<Label>,
    }
}

message! {
    /// A key with a string or a number.
    Label {
        /// The key (string index).
        1 => key: scalar int64 as i64,
        /// A string value (string index).
        2 => str: scalar int64 as i64,
        /// A numeric value.
        3 => num: scalar int64 as i64,
        /// The numeric value's unit (string index).
        4 => num_unit: scalar int64 as i64,
    }
}

message! {
    /// An address range of a mapped binary.
    Mapping {
        /// Nonzero id.
        1 => id: scalar uint64 as u64,
        /// First address.
        2 => memory_start: scalar uint64 as u64,
        /// One past the last address.
        3 => memory_limit: scalar uint64 as u64,
        /// Offset in the file of the first address.
        4 => file_offset: scalar uint64 as u64,
        /// The binary's name (string index).
        5 => filename: scalar int64 as i64,
        /// Its build id (string index).
        6 => build_id: scalar int64 as i64,
        /// Locations are already symbolised: viewers need not look the binary up.
        7 => has_functions: scalar bool as bool,
        /// Locations name their files.
        8 => has_filenames: scalar bool as bool,
        /// Locations carry line numbers.
        9 => has_line_numbers: scalar bool as bool,
        /// Locations list their inlined functions.
        10 => has_inline_frames: scalar bool as bool,
    }
}

message! {
    /// One program counter with its source lines.
    Location {
        /// Nonzero id.
        1 => id: scalar uint64 as u64,
        /// The mapping it lies in (0: none).
        2 => mapping_id: scalar uint64 as u64,
        /// The program counter.
        3 => address: scalar uint64 as u64,
        /// Source lines, the innermost inlined function first, the function they were inlined
        /// into last.
        4 => line: repeated message as Vec<Line>,
    }
}

message! {
    /// A function and a line in it.
    Line {
        /// The function's id.
        1 => function_id: scalar uint64 as u64,
        /// Line number (0: unknown).
        2 => line: scalar int64 as i64,
    }
}

message! {
    /// A function.
    Function {
        /// Nonzero id.
        1 => id: scalar uint64 as u64,
        /// Its readable (demangled) name (string index).
        2 => name: scalar int64 as i64,
        /// Its name as the binary spells it (string index).
        3 => system_name: scalar int64 as i64,
        /// Its source file (string index).
        4 => filename: scalar int64 as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn messages_round_trip_and_skip_fields_they_do_not_know() {
        let profile = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample {
                location_id: vec![1, 2, u64::MAX],
                value: vec![0, -5, i64::MAX],
                label: vec![Label {
                    key: 3,
                    str: 4,
                    ..Label::default()
                }],
            }],
            mapping: vec![Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x2000,
                has_functions: true,
                has_inline_frames: true,
                ..Mapping::default()
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 1,
                address: 0x1234,
                line: vec![
                    Line {
                        function_id: 1,
                        line: 7,
                    },
                    Line {
                        function_id: 2,
                        line: 0,
                    },
                ],
            }],
            function: vec![Function {
                id: 1,
                name: 1,
                system_name: 1,
                filename: 2,
            }],
            string_table: ["", "a", "b", "c", "d"].map(String::from).to_vec(),
            time_nanos: 12,
            duration_nanos: 34,
            period_type: Some(ValueType { r#type: 1, unit: 2 }),
            period: 524_288,
            comment: vec![1, 2],
            default_sample_type: 1,
        };
        let bytes = profile.encode_to_vec();
        assert_eq!(bytes.len(), profile.encoded_len());
        assert_eq!(Profile::decode(bytes.as_slice()).unwrap(), profile);
        // Field 15 (`doc_url` in newer schemas) is skipped, not an error.
        let mut extended = bytes.clone();
        encoding::string::encode(15, &"https://x".to_string(), &mut extended);
        assert_eq!(Profile::decode(extended.as_slice()).unwrap(), profile);
        // Defaults are not written at all.
        assert!(Profile::default().encode_to_vec().is_empty());
    }

    #[test]
    fn field_numbers_are_the_schemas() {
        // `Sample { location_id: [5] }`: field 1, wire type 2 (packed), length 1, value 5.
        let sample = Sample {
            location_id: vec![5],
            ..Sample::default()
        };
        assert_eq!(sample.encode_to_vec(), [0x0a, 1, 5]);
        // `Profile { default_sample_type: 3 }`: field 14, varint.
        let profile = Profile {
            default_sample_type: 3,
            ..Profile::default()
        };
        assert_eq!(profile.encode_to_vec(), [14 << 3, 3]);
        // `Mapping { has_inline_frames }`: field 10, varint 1.
        let mapping = Mapping {
            has_inline_frames: true,
            ..Mapping::default()
        };
        assert_eq!(mapping.encode_to_vec(), [10 << 3, 1]);
    }
}
