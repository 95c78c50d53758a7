//! Whether an exited slot owner's teardown has ended. A process leaves its slot at exit (atexit)
//! and its lifetime lock drops when the kernel closes the region's descriptor, which can come
//! before it closes the driver's, where the driver frees the process's device memory: reaping the
//! slot then let a sibling take memory the device still held (CI, 16 processes exiting under
//! load: 2 MiB over a 2 GiB cap). A zombie (`zombie`: every thread ended), or a process gone, has
//! closed every descriptor, so an exited slot is reaped only then. The start time recorded at registration tells the owner from
//! a later process with its pid (pid reuse, a restarted container, another pid namespace).

/// Start time of process `pid` in clock ticks since boot, and whether its leader thread has ended
/// (`Z`): `None` where there is no such process or its stat cannot be read.
fn stat(pid: i32) -> Option<(u64, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// `/proc/<pid>/stat`: fields after the command (which may hold spaces and parentheses) are the
/// state (3rd field) and, 19 further, the start time (22nd).
fn parse_stat(text: &str) -> Option<(u64, bool)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, matches!(state, "Z" | "X" | "x")))
}

/// This process's start time (0: unknown), recorded in the slots it registers.
pub fn own_start() -> u64 {
    stat(std::process::id() as i32).map_or(0, |(start, _)| start)
}

/// Whether the owner `pid`, started at `start` (0: unknown), can no longer hold device memory:
/// it is gone, a zombie, or its pid is another process's now. Unknown counts as ended (the
/// slot's lifetime lock alone decides, as before start times were recorded).
pub fn ended(pid: i32, start: u64) -> bool {
    if start == 0 || pid <= 0 {
        return true;
    }
    stat(pid).is_none_or(|(now, leader_z)| now != start || (leader_z && one_thread_left(pid)))
}

/// The whole process exited and waits to be reaped: its leader's state is `Z` and no other thread
/// is left. A leader is `Z` too while its other threads still run (it called pthread_exit) or
/// still tear down (a SIGKILL reaches every thread; the descriptors close with the last one), and
/// then the process may still hold what it held.
pub(crate) fn zombie(pid: i32) -> bool {
    stat(pid).is_some_and(|(_, leader_z)| leader_z) && one_thread_left(pid)
}

fn one_thread_left(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_command_with_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((987654, false)));
        assert_eq!(parse_stat(&line.replace(") S ", ") Z ")), Some((987654, true)));
        assert_eq!(parse_stat("4242 (x) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_has_not_ended_and_another_start_is_another_process() {
        let (pid, start) = (std::process::id() as i32, own_start());
        assert_ne!(start, 0, "/proc/self/stat unreadable");
        assert!(!ended(pid, start));
        assert!(ended(pid, start + 1), "a later process with the pid is not the owner");
        assert!(ended(pid, 0), "an unknown start leaves the lock to decide");
        assert!(ended(i32::MAX, start), "no such process");
    }
}
