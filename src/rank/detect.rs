//! Which rank this process is, from the environment a launcher gave it.
//!
//! | launcher | rank | world size | local rank | run id |
//! |---|---|---|---|---|
//! | torchrun (`torch.distributed.run`) | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `TORCHELASTIC_RUN_ID` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `PMIX_NAMESPACE` |
//! | PMI (MPICH's and Intel MPI's Hydra) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `PMIX_NAMESPACE` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_STEP_NUM_TASKS`, else `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURM_JOB_ID`.`SLURM_STEP_ID` |
//!
//! The first launcher in this order whose rank *and* world size are set wins: launchers nest
//! (torchrun inside an `srun` step, `mpirun` inside a Slurm allocation), and the innermost
//! one, listed first, is the one that started this process. `RANK` alone, without
//! `WORLD_SIZE`, is not taken for torchrun's (the name is too common). Slurm's variables count
//! only in a task `srun` started (`SLURM_STEP_ID` set): a batch script has `SLURM_PROCID=0`
//! and the allocation's task count, but it is one process.
//!
//! The run id is `HIGHWATER_RUN_ID` when set, else the first launcher id found in the table's
//! order (torchrun's `none`, its default for a static rendezvous, is no id).

use std::ffi::OsString;

use crate::error::Error;

/// A rank, as a launcher or the program gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankInfo {
    /// This process's rank, below `world_size`.
    pub(crate) rank: u32,
    /// Processes in the run.
    pub(crate) world_size: u32,
    /// The rank among the run's processes on this host, when the launcher says.
    pub(crate) local_rank: Option<u32>,
    /// Who said: `"torchrun"`, `"openmpi"`, `"pmi"`, `"slurm"` or `"builder"`.
    pub(crate) launcher: &'static str,
}

/// What the environment says about the run this process belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Launch {
    /// The rank a launcher gave this process, if one did.
    pub(crate) rank: Option<RankInfo>,
    /// `HIGHWATER_RUN_ID`, when set.
    pub(crate) explicit_run_id: Option<String>,
    /// The first launcher's run id found, when one is.
    pub(crate) launcher_run_id: Option<String>,
}

/// One launcher's variables.
struct Launcher {
    name: &'static str,
    rank: &'static str,
    /// World size variables, the first one set counting.
    world: &'static [&'static str],
    local: &'static str,
    /// A variable that must be set for the others to count (Slurm: a task of a step).
    requires: Option<&'static str>,
}

const LAUNCHERS: [Launcher; 4] = [
    Launcher {
        name: "torchrun",
        rank: "RANK",
        world: &["WORLD_SIZE"],
        local: "LOCAL_RANK",
        requires: None,
    },
    Launcher {
        name: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        world: &["OMPI_COMM_WORLD_SIZE"],
        local: "OMPI_COMM_WORLD_LOCAL_RANK",
        requires: None,
    },
    Launcher {
        name: "pmi",
        rank: "PMI_RANK",
        world: &["PMI_SIZE"],
        local: "MPI_LOCALRANKID",
        requires: None,
    },
    Launcher {
        name: "slurm",
        rank: "SLURM_PROCID",
        world: &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"],
        local: "SLURM_LOCALID",
        requires: Some("SLURM_STEP_ID"),
    },
];

/// Reads the launchers' variables that `var` returns.
///
/// # Errors
///
/// [`Error::Config`] naming the variable when a launcher's rank, world size or local rank is
/// not a whole number, the world size is 0, or the rank is not below it: a profile written
/// under a wrong rank would replace another rank's.
pub(crate) fn detect(var: impl Fn(&str) -> Option<OsString>) -> Result<Launch, Error> {
    let text = |name: &str| -> Option<String> {
        var(name).map(|value| value.to_string_lossy().trim().to_string())
    };
    let number = |name: &'static str, expected: &'static str| -> Result<Option<u32>, Error> {
        text(name)
            .map(|value| {
                value.parse::<u32>().map_err(|_| Error::Config {
                    var: name,
                    value,
                    expected,
                })
            })
            .transpose()
    };
    let mut rank = None;
    for launcher in &LAUNCHERS {
        if launcher.requires.is_some_and(|name| text(name).is_none())
            || text(launcher.rank).is_none()
        {
            continue;
        }
        let Some(&world_var) = launcher.world.iter().find(|name| text(name).is_some()) else {
            continue;
        };
        let world_size = number(world_var, "a number of processes, at least 1")?
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::Config {
                var: world_var,
                value: text(world_var).unwrap_or_default(),
                expected: "a number of processes, at least 1",
            })?;
        let this = number(launcher.rank, "a rank: a whole number below the world size")?
            .unwrap_or_default();
        if this >= world_size {
            return Err(Error::Config {
                var: launcher.rank,
                value: this.to_string(),
                expected: "a rank below the world size",
            });
        }
        rank = Some(RankInfo {
            rank: this,
            world_size,
            local_rank: number(launcher.local, "a local rank: a whole number")?,
            launcher: launcher.name,
        });
        break;
    }
    let nonempty = |name: &str| text(name).filter(|value| !value.is_empty());
    let slurm_step = nonempty("SLURM_JOB_ID")
        .zip(nonempty("SLURM_STEP_ID"))
        .map(|(job, step)| format!("slurm:{job}.{step}"));
    let launcher_run_id = nonempty("TORCHELASTIC_RUN_ID")
        .filter(|id| id != "none")
        .map(|id| format!("torchrun:{id}"))
        .or_else(|| nonempty("PMIX_NAMESPACE").map(|id| format!("pmix:{id}")))
        .or(slurm_step);
    Ok(Launch {
        rank,
        explicit_run_id: nonempty("HIGHWATER_RUN_ID"),
        launcher_run_id,
    })
}

/// This host's name, or an empty string if it cannot be read.
pub(crate) fn host_name() -> String {
    crate::sys::process::host_name()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect_in(vars: &[(&str, &str)]) -> Result<Launch, Error> {
        detect(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(value))
        })
    }

    fn rank_in(vars: &[(&str, &str)]) -> Option<RankInfo> {
        detect_in(vars).unwrap().rank
    }

    #[test]
    fn no_launcher_no_rank() {
        assert_eq!(detect_in(&[]).unwrap(), Launch::default());
    }

    #[test]
    fn each_launcher_gives_rank_world_and_local_rank() {
        let info = |rank, world_size, local_rank, launcher| RankInfo {
            rank,
            world_size,
            local_rank,
            launcher,
        };
        assert_eq!(
            rank_in(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]),
            Some(info(3, 8, Some(1), "torchrun"))
        );
        assert_eq!(
            rank_in(&[
                ("OMPI_COMM_WORLD_RANK", "5"),
                ("OMPI_COMM_WORLD_SIZE", "16"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1")
            ]),
            Some(info(5, 16, Some(1), "openmpi"))
        );
        assert_eq!(
            rank_in(&[("PMI_RANK", "2"), ("PMI_SIZE", "4")]),
            Some(info(2, 4, None, "pmi"))
        );
        assert_eq!(
            rank_in(&[
                ("SLURM_PROCID", "7"),
                ("SLURM_NTASKS", "64"),
                ("SLURM_STEP_NUM_TASKS", "8"),
                ("SLURM_LOCALID", "3"),
                ("SLURM_STEP_ID", "0"),
            ]),
            Some(info(7, 8, Some(3), "slurm")),
            "the step's task count, not the allocation's"
        );
    }

    #[test]
    fn the_innermost_launcher_wins() {
        // torchrun started by srun: the worker's RANK, not the node's SLURM_PROCID.
        let vars = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "0"),
            ("RANK", "13"),
            ("WORLD_SIZE", "16"),
        ];
        let rank = rank_in(&vars).unwrap();
        assert_eq!((rank.rank, rank.launcher), (13, "torchrun"));
        // mpirun inside a Slurm batch script: every rank inherits the script's SLURM_PROCID=0.
        let vars = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ];
        assert_eq!(rank_in(&vars).unwrap().launcher, "openmpi");
    }

    #[test]
    fn a_lone_rank_variable_or_a_batch_script_is_no_launcher() {
        assert_eq!(rank_in(&[("RANK", "3")]), None);
        assert_eq!(rank_in(&[("WORLD_SIZE", "3")]), None);
        // sbatch's script: rank 0 of the allocation's tasks, but no step of srun's.
        assert_eq!(
            rank_in(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")]),
            None
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (vars, var) in [
            (vec![("RANK", "three"), ("WORLD_SIZE", "8")], "RANK"),
            (vec![("RANK", "3"), ("WORLD_SIZE", "-8")], "WORLD_SIZE"),
            (vec![("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE"),
            (vec![("RANK", "8"), ("WORLD_SIZE", "8")], "RANK"),
            (
                vec![("RANK", "1"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "x")],
                "LOCAL_RANK",
            ),
        ] {
            let message = detect_in(&vars).unwrap_err().to_string();
            assert!(message.contains(var), "{vars:?}: {message}");
        }
    }

    #[test]
    fn run_ids_come_from_highwater_then_the_launchers() {
        let launch = detect_in(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_RUN_ID", "job-17"),
            ("SLURM_JOB_ID", "991"),
            ("SLURM_STEP_ID", "2"),
            ("HIGHWATER_RUN_ID", "nightly"),
        ])
        .unwrap();
        assert_eq!(launch.explicit_run_id.as_deref(), Some("nightly"));
        assert_eq!(launch.launcher_run_id.as_deref(), Some("torchrun:job-17"));
        let slurm = detect_in(&[
            ("TORCHELASTIC_RUN_ID", "none"),
            ("SLURM_JOB_ID", "991"),
            ("SLURM_STEP_ID", "2"),
        ])
        .unwrap();
        assert_eq!(slurm.launcher_run_id.as_deref(), Some("slurm:991.2"));
        assert_eq!(
            detect_in(&[("PMIX_NAMESPACE", "prterun-n1-4242@1")])
                .unwrap()
                .launcher_run_id
                .as_deref(),
            Some("pmix:prterun-n1-4242@1")
        );
    }

    #[test]
    fn the_host_has_a_name() {
        assert!(!host_name().is_empty());
    }
}
