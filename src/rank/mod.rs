//! Many processes, one run: which rank this process is, and the names its outputs take.
//!
//! # Ranks
//!
//! Training that outgrows one process runs one process per device (data-parallel ranks,
//! pipeline stages, tensor-parallel shards), started by a launcher that tells each process its
//! rank through the environment. [`detect`] reads the common launchers' variables
//! (torchrun, Open MPI, PMI, Slurm); the program can also say itself
//! ([`SessionBuilder::rank`](crate::SessionBuilder::rank)). The profile records the rank, the
//! world size, the host and the launcher in its `meta`, and a run id that every process of the
//! run shares (`highwater ranks` compares one run's profiles by it).
//!
//! # Names
//!
//! Every process of a run usually gets the same `HIGHWATER_OUT`, often on one shared file
//! system, so [`naming`] makes the names differ: placeholders (`{rank}`, `{local_rank}`,
//! `{pid}`, `{host}`) are filled in, and with a rank known and no placeholder the file name
//! carries it (`highwater-profile.rank3.json`). The HTML report, the checkpoints and the
//! allocation log follow.
//!
//! # Never two writers of one file
//!
//! A name can still be shared (two processes told the same rank, copies of a program started
//! by hand). Before recording, each output is [claimed](claim): a POSIX record lock on a hidden
//! file beside it, which the kernel drops when the process ends however it ends, so a claim
//! never outlives its writer. A process that finds the name claimed by another live process
//! says so and writes beside it (`highwater-profile.pid4242.json`).

mod claim;
mod detect;
mod naming;

pub(crate) use claim::{claim_output, Claim};
pub(crate) use detect::{detect, host_name, Launch, RankInfo};
pub(crate) use naming::{name_output, NameContext};
