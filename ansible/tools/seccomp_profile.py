#!/usr/bin/env python3
"""Write the instances' seccomp profile: the engine's default policy plus NUMA calls.

Why: vLLM's CPU backend binds memory to the instance's NUMA node (libnuma:
get_mempolicy, set_mempolicy, mbind; page migration with migrate_pages and
move_pages). Docker's default profile allows the first three only when the
container holds CAP_SYS_NICE and has no rule for the last two, so a container
sees "get_mempolicy: Operation not permitted" and vLLM's binding silently
degrades. Rather than `--security-opt seccomp=unconfined` (or --privileged),
the instances get the default policy with exactly those five calls added.

How it is derived: the lists below restate the policy of the engine's default
profile (moby `profiles/seccomp/default.json` as Debian 12's docker.io
20.10.24 ships it: default ERRNO(EPERM); an allow list; calls allowed only
with a capability; clone without namespace flags; clone3 answered with ENOSYS
so glibc falls back to clone) for the two architectures zenvllm targets
(x86_64 and aarch64), then add NUMA_CALLS unconditionally. Regenerate with

    cd ansible && python3 tools/seccomp_profile.py \
        > roles/zenvllm_instances/files/seccomp-numa.json

and a unit test checks the shipped file matches this script's output;
tests/reliability/test_seccomp_profile.py compares it, by effect, with the
running engine's own default.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

MARK = (
    "zenvllm: the engine's default seccomp policy plus the NUMA memory-policy calls "
    "(ansible/tools/seccomp_profile.py)"
)
# The memory-policy and page-migration calls vLLM/libnuma make; the reason for this file.
NUMA_CALLS = ("get_mempolicy", "mbind", "migrate_pages", "move_pages", "set_mempolicy")

# Allowed for every container by the default policy.
_ALLOW_TEXT = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32
clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2
dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64
fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchown fchown32 fchownat fcntl
fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64
fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv
futimesat getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid
getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid
getpriority getrandom getresgid getresgid32 getresuid getresuid32 getrlimit get_robust_list
getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid getuid32
getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl
io_destroy io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup
io_submit io_uring_enter io_uring_register io_uring_setup ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen
listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise membarrier
memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2
mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend
mq_timedsend_time64 mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock munlockall
munmap nanosleep newfstatat _newselect open openat openat2 pause pidfd_open
pidfd_send_signal pipe pipe2 poll ppoll ppoll_time64 prctl
pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev
pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64
recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq
rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr
sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop
semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32
setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid setpriority
setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32
setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask
sigreturn socket socketcall socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat
sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate
truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes
vfork vmsplice wait4 waitid waitpid write writev
"""
ALLOW = _ALLOW_TEXT.split()

# Allowed only when the container holds the capability (docker adds these
# rules at container creation from the granted capabilities).
BY_CAPABILITY = {
    "CAP_DAC_READ_SEARCH": "open_by_handle_at",
    "CAP_SYS_ADMIN": (
        "bpf clone clone3 fanotify_init fsconfig fsmount fsopen fspick lookup_dcookie mount "
        "mount_setattr move_mount name_to_handle_at open_tree perf_event_open quotactl "
        "quotactl_fd setdomainname sethostname setns syslog umount umount2 unshare"
    ),
    "CAP_SYS_BOOT": "reboot",
    "CAP_SYS_CHROOT": "chroot",
    "CAP_SYS_MODULE": "delete_module init_module finit_module",
    "CAP_SYS_PACCT": "acct",
    "CAP_SYS_PTRACE": "kcmp pidfd_getfd process_madvise process_vm_readv process_vm_writev ptrace",
    "CAP_SYS_RAWIO": "iopl ioperm",
    "CAP_SYS_TIME": "settimeofday stime clock_settime",
    "CAP_SYS_TTY_CONFIG": "vhangup",
    "CAP_SYSLOG": "syslog",
}

# personality(2) personas the default policy permits: PER_LINUX, UNAME26,
# PER_LINUX32, PER_LINUX32|UNAME26 and the query value 0xffffffff.
PERSONALITIES = (0, 8, 131072, 131080, 4294967295)
# clone(2) flags that create namespaces; without CAP_SYS_ADMIN they stay forbidden.
CLONE_NAMESPACE_FLAGS = 2114060288
ENOSYS = 38


def rule(names: str | Iterable[str], **extra: Any) -> dict[str, Any]:
    names = names.split() if isinstance(names, str) else list(names)
    return {"names": names, "action": "SCMP_ACT_ALLOW", **extra}


def profile() -> dict[str, Any]:
    syscalls = [
        rule(ALLOW),
        rule("ptrace", includes={"minKernel": "4.8"}),
        *(
            rule("personality", args=[{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}])
            for v in PERSONALITIES
        ),
        rule(
            "arm_fadvise64_64 arm_sync_file_range sync_file_range2 breakpoint cacheflush set_tls",
            includes={"arches": ["arm", "arm64"]},
        ),
        rule("arch_prctl", includes={"arches": ["amd64", "x32"]}),
        rule("modify_ldt", includes={"arches": ["amd64", "x32", "x86"]}),
        *(rule(names, includes={"caps": [cap]}) for cap, names in BY_CAPABILITY.items()),
        rule(
            "clone",
            args=[{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "op": "SCMP_CMP_MASKED_EQ"}],
            excludes={"caps": ["CAP_SYS_ADMIN"]},
        ),
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
        rule(NUMA_CALLS, comment="zenvllm: NUMA memory policy for vLLM's CPU backend"),
    ]
    return {
        # Engines ignore unknown keys; the role knows its own file by this one and never
        # replaces a profile of the same path that someone else wrote.
        "comment": MARK,
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {
                "architecture": "SCMP_ARCH_X86_64",
                "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            },
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        ],
        "syscalls": syscalls,
    }


def main() -> int:
    json.dump(profile(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
