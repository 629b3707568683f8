//! Taking a lab down: when a `Lab` is dropped (front to back: nginx, the gateways, the
//! stores), and from its state file alone (`hongbao lab down`).

use std::path::Path;

use crate::{disk, netns, proc, Error, Lab, LabState, Result, GRACE};

impl Drop for Lab {
    fn drop(&mut self) {
        // Front to back: nginx, the gateways, then the stores.
        if let Some((_, p)) = &mut self.nginx {
            drop(p.take());
        }
        for i in 0..self.gateways.len() {
            if let Some(mut p) = self.gateways[i].proc.take() {
                let children = children_of(p.pid());
                p.stop(GRACE);
                for pid in children {
                    // SAFETY: the gateway's worker ids, read before it stopped.
                    unsafe {
                        libc::kill(pid as i32, libc::SIGKILL);
                    }
                }
            }
        }
        for (_, p) in &mut self.redis {
            drop(p.take());
        }
        drop(self.postgres.1.take());
        for shard in &mut self.shards {
            drop(shard.proc.take());
        }
        for formation in self.formations_mut() {
            // The data nodes, then the monitor; each keeper stops its PostgreSQL.
            for node in &mut formation.nodes {
                drop(node.keeper.take());
            }
            drop(formation.monitor.keeper.take());
        }
        netns::stop_inside(&self.state.netns, GRACE);
        netns::remove(self.plan.lab, &self.state.netns);
        drop(self.postgres_disk.take());
        let _ = std::fs::remove_dir_all(&self.postgres_dir);
        for dir in &self.state.shard_dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
        let _ = std::fs::remove_file(self.plan.dir.join("lab.json"));
    }
}

/// Tears down a lab from its state file (`DIR/lab.json`): stops the processes it
/// recorded (only those whose ids still name them) and any other still running inside
/// its hosts (one started there by hand, such as a PostgreSQL restarted), removes its
/// hosts and bridge.
pub fn down(dir: &Path) -> Result<LabState> {
    let path = dir.join("lab.json");
    let reading = || format!("reading {}", path.display());
    let text = std::fs::read(&path).map_err(|e| Error::io(reading(), e))?;
    // A state file that is not JSON is one that does not read (InvalidData, its words).
    let state: LabState =
        serde_json::from_slice(&text).map_err(|e| Error::io(reading(), e.into()))?;
    for record in state.procs.iter().rev() {
        for child in children_of(record.pid) {
            if proc::start_ticks(record.pid) == Some(record.start_ticks) {
                // SAFETY: children of a process we recorded and which is still ours.
                unsafe {
                    libc::kill(child as i32, libc::SIGKILL);
                }
            }
        }
        proc::stop_recorded(record, GRACE);
    }
    netns::stop_inside(&state.netns, GRACE);
    netns::remove(state.lab, &state.netns);
    if let Some(pg) = &state.postgres_dir {
        disk::SmallDisk::clear_stale(pg);
        let _ = std::fs::remove_dir_all(pg);
    }
    for dir in &state.shard_dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_file(&path);
    Ok(state)
}

/// Ids of `pid`'s children, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}
