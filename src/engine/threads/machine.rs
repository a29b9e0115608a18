//! What the thread governor measures, limited to what this process may use: the CPUs of its
//! affinity mask (`sched_getaffinity`: a container's cpuset, `taskset`), only their lines of
//! `/proc/stat`, and the CPU time its cgroup's quota allows (v2 `cpu.max`, v1
//! `cpu.cfs_quota_us` over `cpu.cfs_period_us`; the tightest from the process's cgroup up to
//! the hierarchy's root). The parsing is pure, from the files' text; [`Machine`] reads them.

use std::path::{Path, PathBuf};

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// Busy time of the CPUs this process may run on, niced user time left out.
    pub busy: u64,
    /// All time of those CPUs (idle included).
    pub total: u64,
    /// This process's user and system time.
    pub own: u64,
}

/// One reading of the machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Reading {
    /// The counters.
    pub times: CpuTimes,
    /// CPUs of the affinity mask that `/proc/stat` lists.
    pub cpus: u32,
    /// Cores' worth of CPU time the cgroup's quota allows, `None` without a quota.
    pub cpu_limit: Option<f64>,
}

/// Cores other processes kept busy between two readings, on `cpus` CPUs.
pub(crate) fn other_busy_cores(before: CpuTimes, after: CpuTimes, cpus: u32) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    busy.saturating_sub(own) as f64 / total as f64 * f64::from(cpus)
}

/// The busy and total ticks of the CPUs `in_mask` accepts, from `/proc/stat`'s per-CPU lines
/// (`cpu0`, `cpu1`, …; the machine-wide `cpu` line is not used), and how many of them it lists.
pub(crate) fn parse_proc_stat(text: &str, in_mask: impl Fn(usize) -> bool) -> Option<(u64, u64, u32)> {
    let (mut busy, mut total, mut cpus) = (0u64, 0u64, 0u32);
    for line in text.lines() {
        let Some((id, fields)) = line.strip_prefix("cpu").and_then(|rest| rest.split_once(' ')) else { continue };
        // The machine-wide line has no number.
        let Ok(id) = id.parse::<usize>() else { continue };
        if in_mask(id) {
            let (b, t) = cpu_ticks(fields)?;
            (busy, total, cpus) = (busy + b, total + t, cpus + 1);
        }
    }
    (cpus > 0).then_some((busy, total, cpus))
}

/// Busy and total ticks of one `/proc/stat` CPU line's fields.
fn cpu_ticks(fields: &str) -> Option<(u64, u64)> {
    let mut fields = fields.split_whitespace().map(|f| f.parse::<u64>().ok());
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let mut next = || fields.next().flatten();
    let (user, nice, system, idle, iowait, irq, softirq) =
        (next()?, next()?, next()?, next()?, next()?, next()?, next()?);
    let steal = next().unwrap_or(0);
    let busy = user + system + irq + softirq + steal;
    Some((busy, busy + nice + idle + iowait))
}

/// A process's user plus system ticks, from its `/proc/PID/stat` text.
pub(crate) fn parse_process_stat(text: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime = fields.next()?.parse::<u64>().ok()?;
    let stime = fields.next()?.parse::<u64>().ok()?;
    Some(utime + stime)
}

/// Cores' worth of time a cgroup v2 `cpu.max` allows (`150000 100000`: 1.5), `None` without
/// a limit (`max 100000`).
pub(crate) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse::<u64>().ok()?;
    let period = fields.next()?.parse::<u64>().ok().filter(|&p| p > 0)?;
    Some(quota as f64 / period as f64)
}

/// The same from cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` (a quota of -1: none).
pub(crate) fn parse_cfs_quota(quota: &str, period: &str) -> Option<f64> {
    let quota = quota.trim().parse::<i64>().ok().filter(|&q| q > 0)?;
    let period = period.trim().parse::<u64>().ok().filter(|&p| p > 0)?;
    Some(quota as f64 / period as f64)
}

/// Which cgroup version holds the process's CPU controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CgroupVersion {
    /// `cpu.max`.
    V2,
    /// `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
    V1,
}

/// The directories whose CPU limit applies to this process, its own cgroup's first, then each
/// parent's up to the mount point, from `/proc/self/cgroup` and `/proc/self/mountinfo`. The
/// CPU controller of v1 wins where both versions are mounted (a hybrid system keeps it there).
pub(crate) fn cgroup_dirs(proc_cgroup: &str, mountinfo: &str) -> Option<(CgroupVersion, Vec<PathBuf>)> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "cpu") {
            v1 = Some(path);
        }
    }
    let mounts = mountinfo.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut left = left.split(' ').skip(3);
        let (root, mount_point) = (left.next()?, left.next()?);
        let mut right = right.split(' ');
        let (fs_type, _source, options) = (right.next()?, right.next()?, right.next()?);
        let version = match fs_type {
            "cgroup2" => CgroupVersion::V2,
            "cgroup" if options.split(',').any(|o| o == "cpu") => CgroupVersion::V1,
            _ => return None,
        };
        Some((version, root, mount_point))
    });
    let mounts: Vec<_> = mounts.collect();
    [(CgroupVersion::V1, v1), (CgroupVersion::V2, v2)].into_iter().find_map(|(version, path)| {
        let path = path?;
        let (_, root, mount_point) = mounts.iter().find(|(v, root, _)| *v == version && path.starts_with(root))?;
        let relative = path[root.len()..].trim_start_matches('/');
        let mut dir = Path::new(mount_point).join(relative);
        let mut dirs = vec![dir.clone()];
        while dir != Path::new(mount_point) && dir.pop() {
            dirs.push(dir.clone());
        }
        Some((version, dirs))
    })
}

/// Reads the machine for the governor: the cgroup directories are found once, the files read
/// at every [`Machine::read`] (a container's limits can change while it runs).
#[derive(Debug, Default)]
pub(crate) struct Machine {
    cgroup: Option<(CgroupVersion, Vec<PathBuf>)>,
}

impl Machine {
    /// Finds this process's cgroup, if `/proc` tells.
    pub(crate) fn new() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let cgroup = read("/proc/self/cgroup")
            .zip(read("/proc/self/mountinfo"))
            .and_then(|(cgroup, mountinfo)| cgroup_dirs(&cgroup, &mountinfo));
        Self { cgroup }
    }

    /// Reads the counters now; `None` where `/proc` does not have them.
    pub(crate) fn read(&self) -> Option<Reading> {
        let mask = affinity();
        let in_mask = |cpu: usize| mask.as_ref().is_none_or(|mask| mask(cpu));
        let (busy, total, cpus) = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?, in_mask)?;
        let own = parse_process_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        Some(Reading { times: CpuTimes { busy, total, own }, cpus, cpu_limit: self.cpu_limit() })
    }

    /// The tightest quota from the process's cgroup up.
    fn cpu_limit(&self) -> Option<f64> {
        let (version, dirs) = self.cgroup.as_ref()?;
        let read = |dir: &Path, name: &str| std::fs::read_to_string(dir.join(name)).ok();
        dirs.iter()
            .filter_map(|dir| match version {
                CgroupVersion::V2 => parse_cpu_max(&read(dir, "cpu.max")?),
                CgroupVersion::V1 => parse_cfs_quota(&read(dir, "cpu.cfs_quota_us")?, &read(dir, "cpu.cfs_period_us")?),
            })
            .reduce(f64::min)
    }
}

/// Whether each CPU is in this thread's affinity mask (the sampler's, inherited from the
/// inference thread that starts it and so shared by llama.cpp's workers); `None` where it
/// cannot be read (every CPU counts).
#[cfg(target_os = "linux")]
fn affinity() -> Option<impl Fn(usize) -> bool> {
    let mask = rustix::thread::sched_getaffinity(None).ok()?;
    Some(move |cpu: usize| cpu < rustix::thread::CpuSet::MAX_CPU && mask.is_set(cpu))
}

#[cfg(not(target_os = "linux"))]
fn affinity() -> Option<fn(usize) -> bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1000 300 200 5000 100 10 20 5 0 0\n\
                        cpu0 100 0 50 2000 0 0 0 0 0 0\n\
                        cpu1 900 300 150 3000 100 10 20 5 0 0\n\
                        intr 12345\nctxt 99\n";

    #[test]
    fn only_the_cpus_of_the_mask_are_read_without_niced_time() {
        // cpu1's busy: user 900 (nice apart) + system 150 + irq 10 + softirq 20 + steal 5.
        let cpu1 = (1085, 900 + 300 + 150 + 3000 + 100 + 10 + 20 + 5);
        assert_eq!(parse_proc_stat(STAT, |cpu| cpu == 1), Some((cpu1.0, cpu1.1, 1)));
        assert_eq!(parse_proc_stat(STAT, |cpu| cpu == 0), Some((150, 2150, 1)));
        assert_eq!(parse_proc_stat(STAT, |_| true), Some((150 + cpu1.0, 2150 + cpu1.1, 2)));
        // A mask naming only CPUs /proc/stat does not list (offline), or nothing to read.
        assert_eq!(parse_proc_stat(STAT, |cpu| cpu == 7), None);
        assert_eq!(parse_proc_stat("intr 1\n", |_| true), None);
        assert_eq!(parse_proc_stat("cpu  1 2\ncpu0 1 2\n", |_| true), None);
    }

    #[test]
    fn a_process_stat_with_spaces_in_its_name_is_read() {
        let text = "4242 (fire word) S 1 4242 4242 0 -1 4194304 5000 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_process_stat(text), Some(1234 + 567));
        assert_eq!(parse_process_stat("4242 (x S 1"), None);
    }

    #[test]
    fn other_work_is_the_cpus_busy_time_less_our_own() {
        let before = CpuTimes { busy: 1000, total: 10_000, own: 400 };
        // 200 ticks on 2 CPUs (1 s at 100 Hz): 150 busy, 50 of them ours.
        let after = CpuTimes { busy: 1150, total: 10_200, own: 450 };
        assert!((other_busy_cores(before, after, 2) - 1.0).abs() < 1e-9);
        // Our own time counted beyond the machine's (sampled apart): never below zero.
        let after = CpuTimes { busy: 1010, total: 10_200, own: 500 };
        assert_eq!(other_busy_cores(before, after, 2), 0.0);
        assert_eq!(other_busy_cores(before, before, 2), 0.0);
    }

    #[test]
    fn cgroup_quotas_are_read_as_cores() {
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
        assert_eq!(parse_cpu_max("50000 100000"), Some(0.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("100000 0"), None);
        assert_eq!(parse_cfs_quota("200000\n", "100000\n"), Some(2.0));
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
    }

    #[test]
    fn the_cgroup_s_directories_are_found_from_its_path_up() {
        let mountinfo = "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 \
                         rw,nsdelegate\n30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";
        let dirs = cgroup_dirs("0::/system.slice/firstword.service\n", mountinfo);
        let expected =
            ["/sys/fs/cgroup/system.slice/firstword.service", "/sys/fs/cgroup/system.slice", "/sys/fs/cgroup"];
        assert_eq!(dirs, Some((CgroupVersion::V2, expected.iter().map(PathBuf::from).collect())));
        // In a container's cgroup namespace the process is at the root of what it sees.
        assert_eq!(cgroup_dirs("0::/\n", mountinfo), Some((CgroupVersion::V2, vec![PathBuf::from("/sys/fs/cgroup")])));
        // cgroup v1 (the v2 line has no cgroup2 mount); a mount whose root is the container's.
        let v1 = "9:name=systemd:/\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/docker/abc\n0::/\n";
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                         32 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                         33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n";
        assert_eq!(cgroup_dirs(v1, mountinfo), Some((CgroupVersion::V1, vec![PathBuf::from("/sys/fs/cgroup/cpu")])));
        assert_eq!(cgroup_dirs("0::/\n", "30 1 8:1 / / rw - ext4 /dev/sda1 rw\n"), None);
    }
}
