//! librsync delta commands: splitting a `fast_rsync` delta into its command
//! bytes and its literal data (the shape a DELTA frame carries), parsing
//! command bytes from the network, and joining commands and literals back
//! into a delta that `rdiff patch` or `fast_rsync::apply` accept.
//!
//! Main type: [`DeltaCommand`].

/// librsync's delta magic.
pub const DELTA_MAGIC: u32 = 0x7273_0236;
const OP_END: u8 = 0x00;
const OP_LITERAL_1: u8 = 0x01;
const OP_LITERAL_64: u8 = 0x40;
const OP_LITERAL_N1: u8 = 0x41;
const OP_LITERAL_N8: u8 = 0x44;
const OP_COPY_N1_N1: u8 = 0x45;
const OP_COPY_N8_N8: u8 = 0x54;

/// What is wrong with a run of delta command bytes.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DeltaError {
    /// A command byte librsync does not define (or END inside a window).
    #[error("unknown delta command byte {command:#04x} at offset {offset}")]
    UnknownCommand {
        /// The byte.
        command: u8,
        /// Where it was.
        offset: usize,
    },
    /// A command whose operands are cut off.
    #[error("delta command at offset {offset} is cut off")]
    Truncated {
        /// Where the command started.
        offset: usize,
    },
    /// A copy or literal of zero bytes (librsync never writes one).
    #[error("zero-length delta command at offset {offset}")]
    ZeroLength {
        /// Where the command started.
        offset: usize,
    },
    /// Not a librsync delta (only when splitting a whole delta).
    #[error("not a librsync delta")]
    NotADelta,
}

/// One librsync delta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaCommand {
    /// Copy `len` bytes from the basis at `offset`.
    Copy {
        /// Offset in the basis.
        offset: u64,
        /// Bytes to copy.
        len: u64,
    },
    /// Take the next `len` bytes of literal data.
    Literal {
        /// Bytes of literal data.
        len: u64,
    },
}

impl DeltaCommand {
    /// Bytes of new body this command produces.
    pub fn output_len(&self) -> u64 {
        match *self {
            DeltaCommand::Copy { len, .. } | DeltaCommand::Literal { len } => len,
        }
    }

    /// Appends the command in librsync's encoding (smallest operand widths,
    /// as librsync and fast_rsync write them) to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        match *self {
            DeltaCommand::Literal { len } => {
                debug_assert!(len > 0);
                if len <= 64 {
                    out.push(OP_LITERAL_1 + (len - 1) as u8);
                } else {
                    let class = size_class(len);
                    out.push(OP_LITERAL_N1 + class);
                    write_operand(len, class, out);
                }
            }
            DeltaCommand::Copy { offset, len } => {
                let (offset_class, len_class) = (size_class(offset), size_class(len));
                out.push(OP_COPY_N1_N1 + offset_class * 4 + len_class);
                write_operand(offset, offset_class, out);
                write_operand(len, len_class, out);
            }
        }
    }
}

/// 0, 1, 2, 3 for operands of 1, 2, 4, 8 bytes.
fn size_class(value: u64) -> u8 {
    match value {
        0..=0xff => 0,
        0x100..=0xffff => 1,
        0x1_0000..=0xffff_ffff => 2,
        _ => 3,
    }
}

fn write_operand(value: u64, class: u8, out: &mut Vec<u8>) {
    let width = 1usize << class;
    out.extend_from_slice(&value.to_be_bytes()[8 - width..]);
}

/// Reads the command at `at`: the command and the offset just past it.
fn read_command(bytes: &[u8], at: usize) -> Result<(DeltaCommand, usize), DeltaError> {
    let truncated = DeltaError::Truncated { offset: at };
    let &op = bytes.get(at).ok_or(DeltaError::Truncated { offset: at })?;
    let mut next = at + 1;
    let mut operand = |class: u8| -> Result<u64, DeltaError> {
        let width = 1usize << class;
        let raw = bytes.get(next..next + width).ok_or(truncated.clone())?;
        next += width;
        let mut be = [0; 8];
        be[8 - width..].copy_from_slice(raw);
        Ok(u64::from_be_bytes(be))
    };
    let command = match op {
        OP_LITERAL_1..=OP_LITERAL_64 => DeltaCommand::Literal {
            len: u64::from(op - OP_LITERAL_1 + 1),
        },
        OP_LITERAL_N1..=OP_LITERAL_N8 => DeltaCommand::Literal {
            len: operand(op - OP_LITERAL_N1)?,
        },
        OP_COPY_N1_N1..=OP_COPY_N8_N8 => {
            let mode = op - OP_COPY_N1_N1;
            let offset = operand(mode / 4)?;
            let len = operand(mode % 4)?;
            DeltaCommand::Copy { offset, len }
        }
        command => {
            return Err(DeltaError::UnknownCommand {
                command,
                offset: at,
            });
        }
    };
    if command.output_len() == 0 {
        return Err(DeltaError::ZeroLength { offset: at });
    }
    Ok((command, next))
}

/// Parses command bytes (no magic, no END) from the network; stops after
/// the first error.
///
/// # Errors
/// Unknown or END command bytes, cut-off operands, zero lengths.
pub fn parse_commands(bytes: &[u8]) -> impl Iterator<Item = Result<DeltaCommand, DeltaError>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        match read_command(bytes, at) {
            Ok((command, next)) => {
                at = next;
                Some(Ok(command))
            }
            Err(error) => {
                at = bytes.len();
                Some(Err(error))
            }
        }
    })
}

/// Splits a whole librsync delta (magic … END) that we produced into
/// commands, calling `each` with every command and its literal data.
///
/// # Errors
/// [`DeltaError`] when `delta` is not a well-formed librsync delta.
pub fn split_delta(
    delta: &[u8],
    mut each: impl FnMut(DeltaCommand, &[u8]),
) -> Result<(), DeltaError> {
    let body = delta
        .strip_prefix(&DELTA_MAGIC.to_be_bytes())
        .and_then(|d| d.strip_suffix(&[OP_END]))
        .ok_or(DeltaError::NotADelta)?;
    // Literal data sits inline after each literal command.
    let mut at = 0;
    while at < body.len() {
        let (command, next) = read_command(body, at)?;
        at = next;
        let data = match command {
            DeltaCommand::Literal { len } => {
                let data = usize::try_from(len)
                    .ok()
                    .and_then(|len| body.get(at..at.checked_add(len)?))
                    .ok_or(DeltaError::Truncated { offset: at })?;
                at += data.len();
                data
            }
            DeltaCommand::Copy { .. } => &[][..],
        };
        each(command, data);
    }
    Ok(())
}

/// Joins commands and their literal data into a whole librsync delta
/// (magic … END), as `rdiff patch` reads it.
///
/// # Errors
/// Malformed commands, or literal data that does not match the commands.
pub fn join_delta(commands: &[u8], literals: &[u8]) -> Result<Vec<u8>, DeltaError> {
    let mut delta = DELTA_MAGIC.to_be_bytes().to_vec();
    let mut at = 0usize;
    for command in parse_commands(commands) {
        let command = command?;
        command.write(&mut delta);
        if let DeltaCommand::Literal { len } = command {
            let data = usize::try_from(len)
                .ok()
                .and_then(|len| literals.get(at..at.checked_add(len)?))
                .ok_or(DeltaError::Truncated { offset: at })?;
            delta.extend_from_slice(data);
            at += data.len();
        }
    }
    if at != literals.len() {
        return Err(DeltaError::Truncated { offset: at });
    }
    delta.push(OP_END);
    Ok(delta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_at_every_operand_width() {
        let commands = [
            DeltaCommand::Literal { len: 1 },
            DeltaCommand::Literal { len: 64 },
            DeltaCommand::Literal { len: 65 },
            DeltaCommand::Literal { len: 70_000 },
            DeltaCommand::Literal { len: 1 << 33 },
            DeltaCommand::Copy { offset: 0, len: 1 },
            DeltaCommand::Copy {
                offset: 300,
                len: 5,
            },
            DeltaCommand::Copy {
                offset: 1 << 20,
                len: 1 << 16,
            },
            DeltaCommand::Copy {
                offset: 1 << 40,
                len: 1 << 40,
            },
        ];
        let mut bytes = Vec::new();
        for c in commands {
            c.write(&mut bytes);
        }
        let parsed: Vec<_> = parse_commands(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(parsed, commands);
    }

    #[test]
    fn parse_rejects_end_unknown_truncated_and_zero() {
        let first = |b: &[u8]| parse_commands(b).find_map(Result::err);
        assert_eq!(
            first(&[0x00]),
            Some(DeltaError::UnknownCommand {
                command: 0,
                offset: 0
            })
        );
        assert_eq!(
            first(&[0x01, 0x55]),
            Some(DeltaError::UnknownCommand {
                command: 0x55,
                offset: 1
            })
        );
        assert_eq!(
            first(&[0x54, 0, 0]),
            Some(DeltaError::Truncated { offset: 0 })
        );
        assert_eq!(
            first(&[0x45, 3, 0]),
            Some(DeltaError::ZeroLength { offset: 0 })
        );
        assert_eq!(
            first(&[0x41, 0]),
            Some(DeltaError::ZeroLength { offset: 0 })
        );
    }

    #[test]
    fn split_then_join_gives_back_a_fast_rsync_delta() {
        let base: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut new = base.clone();
        new.splice(3000..3000, b"inserted text".iter().copied());
        let sig = fast_rsync::Signature::calculate(
            &base,
            fast_rsync::SignatureOptions {
                block_size: 512,
                crypto_hash_size: 8,
            },
        );
        let mut delta = Vec::new();
        fast_rsync::diff(&sig.index(), &new, &mut delta).unwrap();
        let (mut commands, mut literals) = (Vec::new(), Vec::new());
        split_delta(&delta, |c, data| {
            c.write(&mut commands);
            literals.extend_from_slice(data);
        })
        .unwrap();
        assert_eq!(join_delta(&commands, &literals).unwrap(), delta);
        assert!(join_delta(&commands, &literals[1..]).is_err());
    }
}
