/* The jail's PID 1 once its setup is done: a small native program, so that a jail between
 * stages costs a few pages, not a Python process (jaild.py, which sets the jail up and opens its
 * first ruleset's channel, then execs this; see that file for the protocol).
 *
 *   ollie-jail-init CONTROL PID_ONE STATE PYTHON PYTHON_PATH SOURCE [SOCK,RULESET,SECCOMP,SUPERVISED ...]
 *
 * CONTROL is the parent's socket, PID_ONE 1 for a PID namespace's init ("2,DEV,DEV": one with a
 * network namespace of its own too, and the devices of its private /tmp and /dev/shm as they were
 * made; 0: a subreaper, the kernel refused namespaces), STATE a memfd of the jail's mounts (jaild.py's, opaque here),
 * PYTHON a descriptor of the interpreter (PYTHON_PATH its path, its argv[0]), SOURCE one of
 * jaild.py, and each channel its socket, its Landlock ruleset (-1: none) and memfds of its
 * seccomp programs (-1: none): the plain one, and the supervised one, which sends its programs'
 * connect(2) calls to us (see `supervise`), used where this kernel lets us supervise. The environment is PYTHONHOME alone, for the builds.
 *
 * A channel's requests (NUL-separated fields) start programs: `spawn ID` then, in the packet or in
 * a fourth descriptor's memfd, `ARGC CWD ARGV... ENV...`, with the program's stdin, stdout and
 * stderr; or kill one's process group: `kill ID`. Each program's child confines itself (no
 * ambient capabilities, no new privileges, Landlock, seccomp, no capabilities), changes to its
 * cwd and execs it, in a process group of its own; its exit comes back as JSON,
 * {"id": ID, "status": CODE} (negative: the signal) or {"id": ID, "error": TEXT}. A message on
 * the control socket asks for a new ruleset's channel, which needs mounts and Python: a child
 * runs jaild.py's `build` on it (and answers it), hands its channel and the mounts' new state
 * back here, and exits.
 * The control socket's end ends the jail: everything in it is killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
#define SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (1UL << 5)
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#define MAX_FDS 8
/* Connects taken up at once, in a jail and of one stage (a burst of them waits in the kernel, so
   that one stage's leave room for the others'); a handler whose connect has waited a second (a
   full backlog) no longer counts, so that connects that wait on one another are all taken up in
   the end: those are bounded by the jail's process limit alone (beyond it, EAGAIN). */
#define MAX_HANDLERS 64
#define STAGE_HANDLERS 16
#define PARKED_AFTER 1.0
#define BUILD_SECONDS 60 /* a build that takes longer is killed, its request answered */

struct program {
    struct sock_fprog prog; /* len 0: none */
    int broken;             /* one was given and could not be read: its stages are refused, never run without it */
};

struct channel {
    int sock, ruleset;
    struct program plain, supervised; /* supervised: the plain one, but its connect(2) calls come to us */
};

struct stage {
    pid_t pid;
    struct channel *channel;
    unsigned long id;
    int report;   /* the socket its child hands its listener and reports a failure to start on, until it closes (-1 since) */
    char *error;  /* what that failure was, answered for it when it is reaped */
    int listener; /* its seccomp filter's notifications, when supervised (-1: none) */
};

static int control, pid_one, state_fd, python_fd, source_fd;
static char *python_path;
static struct channel **channels;
static size_t n_channels;
static struct stage *stages;
static size_t n_stages;
static pid_t builder = -1; /* the Python child building a channel */
struct handler {
    pid_t pid, stage; /* a child answering a connect(2) of a program of `stage` (0: ended) */
    double started;
};
static struct handler *handlers;
static size_t n_handlers;
static int own_network;    /* the jail's network namespace is its own: its loopback is all it reaches */
static int can_supervise;  /* this kernel gives us a filter's notifications, and its targets' descriptors */
static struct seccomp_notif_sizes notif_sizes;
static dev_t jail_devices[2]; /* the jail's private /tmp and /dev/shm, as made (a grant may cover one since) */
static unsigned long building; /* the id of the request it answers */
static double builder_deadline;
static int builder_killed; /* past its deadline: its reap is awaited */
static int builder_sock = -1; /* where it hands the channel back */
static int retiring, children_fd = -1;

/* Take no more calls: the parent starts another jail for them; this one ends once its stages have. */
static void retire(void) {
    static const char message[] = "{\"id\": 0, \"retire\": true}";
    if (retiring) return;
    retiring = 1;
    send(control, message, sizeof message - 1, MSG_NOSIGNAL);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *grow(void *array, size_t count, size_t size) {
    void *p = realloc(array, (count + 1) * size);
    if (!p) _exit(70); /* out of memory: the parent sees the jail end */
    return p;
}

/* A JSON reply; TEXT (an error) is escaped, with what is not ASCII replaced. */
static void reply(int sock, unsigned long id, const char *key, long status, const char *text) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "{\"id\": %lu, \"%s\": ", id, key);
    if (text) {
        buf[n++] = '"';
        for (const unsigned char *c = (const unsigned char *)text; *c && n < (int)sizeof buf - 8; c++) {
            if (*c == '"' || *c == '\\') buf[n++] = '\\', buf[n++] = *c;
            else if (*c < 0x20 || *c > 0x7e) buf[n++] = '?';
            else buf[n++] = *c;
        }
        buf[n++] = '"';
    } else {
        n += snprintf(buf + n, sizeof buf - n, "%ld", status);
    }
    buf[n++] = '}';
    send(sock, buf, n, MSG_NOSIGNAL); /* the parent gone: the next receive ends us */
}

/* A packet and its descriptors (close-on-exec), without waiting (`flags` may add MSG_PEEK: the
   descriptors are then copies); its length, -2 if none is there, -1 at an error. */
static int receive(int sock, char *buf, size_t size, int *fds, int *n_fds, int flags) {
    struct iovec iov = {buf, size};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(MAX_FDS * sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT | flags);
    *n_fds = 0;
    if (n < 0) return errno == EAGAIN || errno == EINTR ? -2 : -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (int i = 0; i < count; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (*n_fds < MAX_FDS) fds[(*n_fds)++] = fd;
                else close(fd);
            }
        }
    }
    return (int)n;
}

static void kill_group(pid_t pid) { /* and the process: a child stopped before it made its group */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
}

static struct stage *find_stage(pid_t pid) {
    for (size_t i = 0; i < n_stages; i++)
        if (stages[i].pid == pid) return &stages[i];
    return NULL;
}

static int is_handler(pid_t pid) {
    for (size_t i = 0; i < n_handlers; i++)
        if (handlers[i].pid == pid) return 1;
    return 0;
}

/* Whether a stage's listener is read now: a call beyond the bounds waits in the kernel until a
   handler ends or has waited PARKED_AFTER (*`soonest`, if sooner, says when one will have). */
static int may_supervise(pid_t stage, double *soonest) {
    size_t all = 0, its = 0;
    double t = now();
    for (size_t i = 0; i < n_handlers; i++) {
        double parks = handlers[i].started + PARKED_AFTER;
        if (parks <= t) continue;
        all++, its += handlers[i].stage == stage;
        if (soonest && parks < *soonest) *soonest = parks;
    }
    return all < MAX_HANDLERS && its < STAGE_HANDLERS;
}

/* Kill our children that are neither a running program nor in one's group, nor the builder, nor a connect's handler. */
static void sweep(void) {
    char list[65536], path[64], stat[1024];
    ssize_t n = pread(children_fd, list, sizeof list - 1, 0);
    if (n <= 0) return;
    list[n] = 0;
    for (char *tok = strtok(list, " \n"); tok; tok = strtok(NULL, " \n")) {
        pid_t pid = (pid_t)atol(tok);
        if (pid <= 0 || pid == builder || find_stage(pid) || is_handler(pid)) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t m = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (m <= 0) continue;
        stat[m] = 0;
        char *end = strrchr(stat, ')');
        long group;
        char state;
        if (!end || sscanf(end + 1, " %c %*d %ld", &state, &group) != 2) continue;
        if (!find_stage((pid_t)group)) kill(pid, SIGKILL);
    }
}

/* What the child reported, if it has: its filter's listener ("L" and the descriptor), or why it
   failed (its end of the socket is closed once it execs or exits). 1: a listener, and more may follow. */
static int read_report(struct stage *s) {
    char text[4200];
    int fds[MAX_FDS], n_fds;
    int n = receive(s->report, text, sizeof text - 1, fds, &n_fds, 0);
    if (n == -2) return 0;
    if (n == 1 && text[0] == 'L' && n_fds == 1 && s->listener < 0) {
        s->listener = fds[0];
        return 1;
    }
    for (int k = 0; k < n_fds; k++) close(fds[k]);
    if (n > 0) {
        text[n] = 0;
        free(s->error);
        s->error = strdup(text);
    }
    close(s->report);
    s->report = -1;
    return 0;
}

static void drop_stage(struct stage *s) {
    if (s->report >= 0) close(s->report);
    if (s->listener >= 0) close(s->listener); /* once no handler holds it either, a call still asking gets ENOSYS */
    for (size_t i = 0; i < n_handlers; i++)
        if (handlers[i].stage == s->pid) handlers[i].stage = 0; /* its pid may be the next stage's */
    free(s->error);
    *s = stages[--n_stages];
}

static void end_channel(size_t i) {
    struct channel *c = channels[i];
    for (size_t j = 0; j < n_stages; j++)
        if (stages[j].channel == c) kill_group(stages[j].pid), stages[j].channel = NULL;
    close(c->sock);
    if (c->ruleset >= 0) close(c->ruleset);
    free(c->plain.prog.filter);
    free(c->supervised.prog.filter);
    free(c);
    channels[i] = channels[--n_channels];
}

/* The seccomp program in memfd `fd` (closed), or none; `broken` if one was given and not read. */
static struct program load_program(int fd) {
    struct program p = {{0, NULL}, 0};
    struct stat st;
    if (fd < 0) return p;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && st.st_size % sizeof(struct sock_filter) == 0 &&
        st.st_size / sizeof(struct sock_filter) <= BPF_MAXINSNS) {
        p.prog.filter = malloc(st.st_size);
        if (p.prog.filter && pread(fd, p.prog.filter, st.st_size, 0) == st.st_size)
            p.prog.len = st.st_size / sizeof(struct sock_filter);
    }
    close(fd);
    p.broken = p.prog.len == 0;
    return p;
}

static void add_channel(int sock, int ruleset, int seccomp, int supervised) {
    struct channel *c = malloc(sizeof *c);
    if (!c) _exit(70);
    c->sock = sock;
    c->ruleset = ruleset;
    c->plain = load_program(seccomp);
    c->supervised = load_program(supervised);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    if (ruleset >= 0) fcntl(ruleset, F_SETFD, FD_CLOEXEC);
    channels = grow(channels, n_channels, sizeof *channels);
    channels[n_channels++] = c;
}

enum { AT_CWD = 1, AT_EXEC, AT_CONFINE };

/* ---- Supervised connect(2) ----
 * Landlock does not govern connecting to a Unix socket by path, so a plain program may make no
 * AF_UNIX socket that could connect. A supervised one may: its filter sends every connect(2) of
 * the jail's programs here, and a handler (a child of ours, so that a connect that waits holds
 * up nothing else) makes it itself, on the program's own socket (pidfd_getfd), with the address
 * read once from the program's memory: what is connected is what was decided, whatever the
 * program's other threads rewrite meanwhile. It connects
 *   - IPv4 and IPv6 sockets as asked: the jail's network is its own, its loopback all there is;
 *   - Unix sockets to an abstract name (the jail's network's own namespace of them), or to a
 *     socket file on the jail's private /tmp or /dev/shm, found by the handler itself (after any
 *     link) and connected to by that descriptor: only the jail's own programs make sockets there.
 * A socket file anywhere else (the user's ssh-agent, docker, tmux, ollie's own server) is
 * refused with EACCES. The filter refuses a program's own listener (seccomp's NEW_LISTENER): the
 * newest filter's listener answers first, and could let the call through unexamined. */

/* Install `prog` with a listener, handed to the init over `report` ("L" and the descriptor). */
static int install_supervised(struct sock_fprog *prog, int report) {
    long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                      SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, prog);
    if (fd < 0 && errno == EINVAL) /* before Linux 5.19: a signal may restart a call being answered */
        fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, prog);
    if (fd < 0) return -1;
    int listener = (int)fd;
    char tag = 'L';
    struct iovec iov = {&tag, 1};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof listener);
    ssize_t sent = sendmsg(report, &msg, MSG_NOSIGNAL);
    close(listener); /* never the program's: whoever holds it answers for the filter */
    return sent == 1 ? 0 : -1;
}

/* Whether notification `id` still waits: its program is alive and in the call, so the pid (and
   the descriptors and memory read through it since the notification came) are that program's. */
static int waiting(int listener, __u64 id) {
    int r;
    while ((r = ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id)) < 0 && errno == EINTR) {
    }
    return r == 0;
}

static void interrupted(int sig) {
    (void)sig; /* a connect that waits is woken each second to see whether its program still does */
}

static sigset_t alarm_only; /* SIGALRM: a handler's wakeups, let in only while it waits on the connect */

/* Wake this handler in a second, or at `deadline` (0: none) if that comes first, and each second
   after (a wakeup that came before the wait began is followed by another); 0 once it has passed. */
static int wake_within(double deadline) {
    double left = deadline ? deadline - now() : 1;
    if (left <= 0) return 0;
    long long us = left > 1 ? 1000000 : (long long)(left * 1e6) + 1;
    struct itimerval in = {{1, 0}, {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)}};
    setitimer(ITIMER_REAL, &in, NULL);
    return 1;
}

/* connect(2) or poll(2) with the wakeups let in (never during the listener's ioctls: a wakeup
   there would fail the answer itself). */
static int connect_woken(int sock, const struct sockaddr *addr, socklen_t len) {
    sigprocmask(SIG_UNBLOCK, &alarm_only, NULL);
    int r = connect(sock, addr, len), error = errno;
    sigprocmask(SIG_BLOCK, &alarm_only, NULL);
    errno = error;
    return r;
}

static int poll_woken(struct pollfd *p) {
    sigprocmask(SIG_UNBLOCK, &alarm_only, NULL);
    int r = poll(p, 1, 1000), error = errno;
    sigprocmask(SIG_BLOCK, &alarm_only, NULL);
    errno = error;
    return r;
}

/* Whether thread `tid` has a signal pending that it catches and does not block: its own call
   would have been interrupted for it (the filter's wait lets only fatal ones through). */
static int signal_for(pid_t tid) {
    char path[64], status[8192];
    snprintf(path, sizeof path, "/proc/%d/status", tid);
    int file = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = file < 0 ? -1 : read(file, status, sizeof status - 1);
    if (file >= 0) close(file);
    if (n <= 0) return 0;
    status[n] = 0;
    unsigned long long mask[4] = {0}; /* SigPnd, ShdPnd, SigBlk, SigCgt */
    const char *names[4] = {"\nSigPnd:", "\nShdPnd:", "\nSigBlk:", "\nSigCgt:"};
    for (int i = 0; i < 4; i++) {
        char *at = strstr(status, names[i]);
        if (at) mask[i] = strtoull(at + 8, NULL, 16);
    }
    return ((mask[0] | mask[1]) & ~mask[2] & mask[3]) != 0;
}

/* connect(2) of `sock` in this handler, as the program's own call would have (within the
   socket's SO_SNDTIMEO, which each wakeup would otherwise start anew); 0 or an errno. */
static int connect_for(int listener, const struct seccomp_notif *req, int sock, const struct sockaddr *addr,
                       socklen_t len) {
    struct timeval timeout = {0, 0};
    socklen_t size = sizeof timeout;
    getsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, &size);
    double deadline = timeout.tv_sec || timeout.tv_usec ? now() + timeout.tv_sec + timeout.tv_usec / 1e6 : 0;
    int domain = AF_UNIX;
    size = sizeof domain;
    getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &size);
    for (int r = (wake_within(deadline), connect_woken(sock, addr, len)), again = 0;;
         r = connect_woken(sock, addr, len), again = 1) {
        if (r == 0 || (again && errno == EISCONN)) return 0; /* EISCONN: it completed between two tries */
        if (errno != EINTR && (errno != EALREADY || !again)) return errno; /* EALREADY at once: the program's own */
        int already = errno == EALREADY;
        if (!waiting(listener, req->id)) _exit(0); /* nobody waits for the answer */
        if (signal_for(req->pid)) return EINTR; /* a TCP connect goes on, as the kernel's would */
        if (!wake_within(deadline)) return domain == AF_UNIX ? EAGAIN : EINPROGRESS; /* as the kernel's timeout says */
        if (already) { /* a TCP connect under way since a wakeup interrupted it: its outcome */
            struct pollfd p = {sock, POLLOUT, 0};
            if (poll_woken(&p) <= 0) continue;
            int error = 0;
            socklen_t size = sizeof error;
            return getsockopt(sock, SOL_SOCKET, SO_ERROR, &error, &size) < 0 ? errno : error;
        }
    }
}

static int on_jail_device(dev_t dev) {
    return dev == jail_devices[0] || dev == jail_devices[1];
}

/* A Unix socket's connect to a path: only to a socket file on the jail's own file systems. */
static int connect_unix_path(int listener, const struct seccomp_notif *req, int sock, const char *path) {
    int dir = AT_FDCWD;
    if (path[0] != '/') { /* relative to the calling thread's cwd */
        char cwd[64];
        snprintf(cwd, sizeof cwd, "/proc/%u/cwd", req->pid);
        dir = open(cwd, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) return EACCES;
        if (!waiting(listener, req->id)) _exit(0);
    }
    char own[sizeof(((struct sockaddr_un *)0)->sun_path) + 32];
    const char *rest = !strncmp(path, "/proc/self/", 11)          ? path + 11
                       : !strncmp(path, "/proc/thread-self/", 18) ? path + 18
                       : !strncmp(path, "/dev/fd/", 8)            ? path + 5
                                                                  : NULL;
    if (rest) { /* the program's /proc, not ours (other spellings of it are: then refused, as not the jail's) */
        snprintf(own, sizeof own, "/proc/%u/%s", req->pid, rest);
        path = own;
    }
    int found = openat(dir, path, O_PATH | O_CLOEXEC);
    int error = found < 0 ? errno : 0;
    if (dir >= 0) close(dir);
    if (found < 0) return error;
    struct stat st;
    if (fstat(found, &st) < 0) error = errno;
    else if (!S_ISSOCK(st.st_mode)) error = ECONNREFUSED; /* as the kernel says of a file that is not a socket */
    else if (!on_jail_device(st.st_dev)) error = EACCES;
    if (!error) {
        struct sockaddr_un via = {.sun_family = AF_UNIX};
        snprintf(via.sun_path, sizeof via.sun_path, "/proc/self/fd/%d", found);
        error = connect_for(listener, req, sock, (struct sockaddr *)&via,
                            offsetof(struct sockaddr_un, sun_path) + strlen(via.sun_path) + 1);
    }
    close(found);
    return error;
}

/* A pidfd of thread `tid`, whose descriptors pidfd_getfd then takes (before Linux 6.9, which
   opens one of a thread, its process's: threads share their descriptors unless one unshared them). */
static int thread_pidfd(pid_t tid) {
    int fd = (int)syscall(SYS_pidfd_open, tid, O_EXCL /* PIDFD_THREAD */);
    if (fd >= 0 || errno != EINVAL) return fd;
    char path[64], status[4096];
    snprintf(path, sizeof path, "/proc/%d/status", tid);
    int file = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = file < 0 ? -1 : read(file, status, sizeof status - 1);
    if (file >= 0) close(file);
    if (n <= 0) return -1;
    status[n] = 0;
    char *tgid = strstr(status, "\nTgid:");
    return tgid ? (int)syscall(SYS_pidfd_open, (pid_t)atol(tgid + 6), 0) : -1;
}

/* Whether a netlink address is the kernel alone, in no group: all a socket of a program without
   capabilities may connect to (this init holds them over the jail's network, where rtnetlink's
   groups would be joined for the program). */
static int kernel_peer(const struct sockaddr_storage *addr, socklen_t len) {
    const struct sockaddr_nl *nl = (const struct sockaddr_nl *)addr;
    return len >= sizeof *nl && nl->nl_family == AF_NETLINK && nl->nl_pid == 0 && nl->nl_groups == 0;
}

/* The program's connect(2) of notification `req`, made here: 0 or the errno it returns. */
static int connect_for_program(int listener, const struct seccomp_notif *req) {
    if (!own_network) return EACCES; /* the host's network: only its own call could be judged by Landlock */
    int fd = (int)req->data.args[0];
    socklen_t len = (socklen_t)req->data.args[2];
    int pidfd = thread_pidfd(req->pid);
    if (pidfd < 0) return EACCES;
    int sock = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0); /* the kernel's order: the descriptor, the address, the socket */
    int error = sock < 0 ? errno : 0;
    close(pidfd);
    if (sock < 0) return waiting(listener, req->id) && error == EBADF ? EBADF : EACCES;
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    struct iovec here = {&addr, len}, there = {(void *)(uintptr_t)req->data.args[1], len};
    if (len > sizeof addr) error = EINVAL;
    else if (len && process_vm_readv(req->pid, &here, 1, &there, 1, 0) != (ssize_t)len) error = EFAULT;
    if (!waiting(listener, req->id)) _exit(0); /* the pid, memory and descriptor may be another's */
    if (error) {
        close(sock);
        return error;
    }
    int domain = 0;
    socklen_t size = sizeof domain;
    struct sockaddr_un *un = (struct sockaddr_un *)&addr;
    size_t at = offsetof(struct sockaddr_un, sun_path);
    if (getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &size) < 0) error = errno; /* ENOTSOCK */
    else if (domain == AF_INET || domain == AF_INET6)
        error = connect_for(listener, req, sock, (struct sockaddr *)&addr, len);
    else if (domain == AF_NETLINK) /* rtnetlink (the seccomp filter allows no other) to the kernel */
        error = !kernel_peer(&addr, len) ? EACCES : connect(sock, (struct sockaddr *)&addr, len) < 0 ? errno : 0;
    else if (domain != AF_UNIX) error = EACCES;
    else if (len <= at || un->sun_family != AF_UNIX || un->sun_path[0] == 0) /* abstract, or the kernel's EINVAL */
        error = connect_for(listener, req, sock, (struct sockaddr *)&addr, len);
    else if (len > sizeof *un)
        error = EINVAL; /* as the kernel says of a name longer than sun_path */
    else {
        char path[sizeof un->sun_path + 1];
        memcpy(path, un->sun_path, len - at);
        path[len - at] = 0; /* the kernel too reads the name up to its first NUL, or the length given */
        error = connect_unix_path(listener, req, sock, path);
    }
    close(sock);
    return error;
}

/* A notification on a stage's listener: answered by a handler of its own. */
static void supervise(struct stage *s) {
    struct seccomp_notif *req = calloc(1, notif_sizes.seccomp_notif);
    struct seccomp_notif_resp *resp = calloc(1, notif_sizes.seccomp_notif_resp);
    if (!req || !resp) _exit(70);
    if (ioctl(s->listener, SECCOMP_IOCTL_NOTIF_RECV, req) < 0) { /* its program gone meanwhile */
        free(req), free(resp);
        return;
    }
    resp->id = req->id;
    pid_t pid = fork();
    if (pid == 0) {
        /* The listener alone, as 3: not the init's sockets, nor other stages' listeners (which
           would outlive their stages in a handler that waits) */
        int listener = s->listener == 3 ? 3 : dup3(s->listener, 3, O_CLOEXEC);
        if (listener != 3) {
            resp->error = -EAGAIN;
            ioctl(s->listener, SECCOMP_IOCTL_NOTIF_SEND, resp);
            _exit(0);
        }
        syscall(SYS_close_range, 4, ~0U, 0);
        struct sigaction wake = {.sa_handler = interrupted}; /* no SA_RESTART: connect returns EINTR */
        sigaction(SIGALRM, &wake, NULL);
        sigemptyset(&alarm_only);
        sigaddset(&alarm_only, SIGALRM);
        sigprocmask(SIG_BLOCK, &alarm_only, NULL);
        int error = req->data.nr == SYS_connect ? connect_for_program(listener, req) : ENOSYS;
        resp->error = -error;
        while (ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    if (pid < 0) {
        resp->error = -EAGAIN;
        ioctl(s->listener, SECCOMP_IOCTL_NOTIF_SEND, resp);
    } else {
        handlers = grow(handlers, n_handlers, sizeof *handlers);
        handlers[n_handlers++] = (struct handler){pid, s->pid, now()};
    }
    free(req), free(resp);
}

/* Whether this kernel lets us supervise: a child's filter with a listener, and a descriptor of
   the child's taken through a pidfd (Yama's ptrace_scope 3 refuses it). Where not, channels run
   their plain programs. */
static int probe_supervision(void) {
    if (!own_network) return 0;
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &notif_sizes) < 0) return 0;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        struct sock_fprog prog = {1, &allow};
        char byte;
        close(pair[0]);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && install_supervised(&prog, pair[1]) == 0)
            while (read(pair[1], &byte, 1) < 0 && errno == EINTR) {
            } /* until the parent has looked */
        _exit(0);
    }
    close(pair[1]);
    int ok = 0;
    if (pid > 0) {
        char byte;
        int fds[MAX_FDS], n_fds = 0;
        struct pollfd p = {pair[0], POLLIN, 0};
        int n = poll(&p, 1, 5000) == 1 ? receive(pair[0], &byte, 1, fds, &n_fds, 0) : -1;
        int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        int theirs = n == 1 && n_fds == 1 && pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, pair[1], 0) : -1;
        ok = theirs >= 0;
        if (theirs >= 0) close(theirs);
        if (pidfd >= 0) close(pidfd);
        for (int k = 0; k < n_fds; k++) close(fds[k]);
        close(pair[0]);
        waitpid(pid, NULL, 0);
    } else {
        close(pair[0]);
    }
    return ok;
}

/* The child's side of a spawn: never returns. A failure goes to `report` as text. */
static void become(struct channel *c, char *cwd, char **argv, char **env, int *stdio, int report) {
    int failure[2] = {0, AT_CONFINE};
    char text[4200];
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    /* Copies above the numbers they go to first: none then overwrites another's source. */
    int moved[5] = {-1, -1, -1, -1, -1}, want = c->ruleset >= 0 ? 5 : 4;
    for (int i = 0; i < 3; i++) moved[i] = fcntl(stdio[i], F_DUPFD_CLOEXEC, 10);
    moved[3] = fcntl(report, F_DUPFD_CLOEXEC, 10);
    if (want == 5) moved[4] = fcntl(c->ruleset, F_DUPFD_CLOEXEC, 10);
    for (int i = 0; i < want; i++)
        if (moved[i] < 0 || dup3(moved[i], i, i < 3 ? 0 : O_CLOEXEC) < 0) goto fail;
    report = 3;
    int ruleset = want == 5 ? 4 : -1;
    if (syscall(SYS_close_range, want, ~0U, 0) < 0) goto fail; /* nothing of ours: the parent's socket least of all */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) goto fail;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) goto fail;
    if (ruleset >= 0 && (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0 || close(ruleset) < 0)) goto fail;
    if (c->plain.broken || c->supervised.broken) {
        errno = EINVAL; /* a seccomp program could not be read */
        goto fail;
    }
    if (c->supervised.prog.len && can_supervise) {
        if (install_supervised(&c->supervised.prog, report) < 0) goto fail;
    } else if (c->plain.prog.len && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &c->plain.prog) < 0) {
        goto fail;
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2] = {{0}};
    if (syscall(SYS_capset, &header, caps) < 0) goto fail;
    failure[1] = AT_CWD;
    if (chdir(cwd) < 0) goto fail;
    failure[1] = AT_EXEC;
    execve(argv[0], argv, env);
fail:
    failure[0] = errno;
    const char *what = failure[1] == AT_CWD ? cwd : failure[1] == AT_EXEC ? argv[0] : "sandbox";
    int n = snprintf(text, sizeof text, "%s: %s", what, strerror(failure[0]));
    if (write(report, text, n < (int)sizeof text ? n : (int)sizeof text - 1) < 0) _exit(127);
    _exit(127);
}

/* `spawn ID` and its body: ARGC CWD ARGV... ENV..., NUL-separated (`body` ends in a NUL). */
static void spawn(struct channel *c, unsigned long id, char *body, size_t len, int *fds, int n_fds) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += body[i] == 0;
    char **fields = calloc(n + 2, sizeof *fields);
    if (!fields) _exit(70);
    size_t k = 0;
    for (char *p = body; p < body + len && k < n; p += strlen(p) + 1) fields[k++] = p;
    long argc = k ? atol(fields[0]) : 0;
    if (n_fds < 3 || argc < 1 || (size_t)argc + 2 > k || !fields[2][0]) {
        reply(c->sock, id, "error", 0, n_fds < 3 ? "no streams to run with" : "no program to run");
        free(fields);
        return;
    }
    /* fields: ARGC CWD ARGV[argc] ENV...: argv ends where env starts, so env moves up one to make
       room for argv's NULL. */
    char *cwd = fields[1], **argv = &fields[2], **env = &fields[2 + argc + 1];
    memmove(env, &fields[2 + argc], (k - 2 - argc) * sizeof *fields);
    argv[argc] = NULL;
    env[k - 2 - argc] = NULL;
    int report[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, report) < 0) {
        reply(c->sock, id, "error", 0, strerror(errno));
        free(fields);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(report[0]);
        become(c, cwd, argv, env, fds, report[1]);
    }
    close(report[1]);
    if (pid < 0) {
        close(report[0]);
        reply(c->sock, id, "error", 0, strerror(errno));
        free(fields);
        return;
    }
    free(fields);
    /* Not waited for here: until it execs, the child is in no domain, and on a kernel without
       Landlock's signal scoping a stage could stop it (and so us, were we waiting). */
    fcntl(report[0], F_SETFL, O_NONBLOCK);
    stages = grow(stages, n_stages, sizeof *stages);
    stages[n_stages++] = (struct stage){pid, c, id, report[0], NULL, -1};
}

static void serve_channel(size_t i) {
    struct channel *c = channels[i];
    char buf[65536];
    int fds[MAX_FDS], n_fds;
    int n = receive(c->sock, buf, sizeof buf - 1, fds, &n_fds, 0);
    if (n == -2) return;
    if (n <= 0 && n_fds == 0) {
        end_channel(i);
        return;
    }
    buf[n > 0 ? n : 0] = 0;
    /* OP\0ID\0 then the body: a packet without both is not ollie's, and ignored */
    size_t len = n > 0 ? (size_t)n : 0, op_len = strnlen(buf, len), id_len = 0, head = len + 1;
    char *op = buf;
    unsigned long id = 0;
    if (op_len < len) {
        id_len = strnlen(buf + op_len + 1, len - op_len - 1);
        if (op_len + 1 + id_len < len) {
            id = strtoul(buf + op_len + 1, NULL, 10);
            head = op_len + 1 + id_len + 1;
        }
    }
    if (head > len) op = "";
    if (!strcmp(op, "spawn") && id) {
        char *body = buf + head, *copy = NULL;
        len -= head;
        if (n_fds == 4) { /* the body in a memfd: a long argv or env */
            struct stat st;
            if (fstat(fds[3], &st) == 0 && st.st_size > 0 && (copy = malloc(st.st_size + 1)) &&
                pread(fds[3], copy, st.st_size, 0) == st.st_size) {
                copy[st.st_size] = 0;
                body = copy, len = st.st_size;
            }
        }
        body[len] = 0;
        spawn(c, id, body, len, fds, n_fds);
        free(copy);
    } else if (!strcmp(op, "kill")) {
        for (size_t j = 0; j < n_stages; j++)
            if (stages[j].channel == c && stages[j].id == id) kill_group(stages[j].pid);
    }
    for (int k = 0; k < n_fds; k++) close(fds[k]);
}

/* The id of the request waiting on the control socket (taken off it unless `flags` has MSG_PEEK); 0: none. */
static unsigned long request_id(int flags) {
    char buf[65536];
    int fds[MAX_FDS], n_fds;
    int n = receive(control, buf, sizeof buf - 1, fds, &n_fds, flags);
    for (int k = 0; k < n_fds; k++) close(fds[k]);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *id = strstr(buf, "\"id\":");
    return id ? strtoul(id + 5, NULL, 10) : 0;
}

/* The builder's end: its channel and the mounts' new state taken ("A C R S U T": see jaild.py's
   `build`), and, if it did not answer (Python would not start, or died), the request answered
   here (and taken off the socket if it was never read). */
static void end_builder(void) {
    char buf[64];
    int fds[MAX_FDS], n_fds, f[6] = {0};
    int n = receive(builder_sock, buf, sizeof buf - 1, fds, &n_fds, 0);
    buf[n > 0 ? n : 0] = 0;
    int well_formed = n > 0 &&
                      sscanf(buf, "%d %d %d %d %d %d", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]) == 6 &&
                      n_fds == !!f[1] + !!f[2] + !!f[3] + !!f[4] + !!f[5];
    int answered = well_formed && f[0], k = 0; /* it read the request and answered it */
    if (well_formed) {
        int sock = f[1] ? fds[k++] : -1, ruleset = f[2] ? fds[k++] : -1, seccomp = f[3] ? fds[k++] : -1;
        int supervised = f[4] ? fds[k++] : -1;
        if (sock >= 0) add_channel(sock, ruleset, seccomp, supervised);
        else { /* no channel: what came with it is of no use */
            if (ruleset >= 0) close(ruleset);
            if (seccomp >= 0) close(seccomp);
            if (supervised >= 0) close(supervised);
        }
        if (f[5]) close(state_fd), state_fd = fds[k++]; /* what the next build goes on from */
    } else { /* it died before it handed back the mounts' state: what it mounted is on record nowhere */
        for (int i = 0; i < n_fds; i++) close(fds[i]);
        retire();
    }
    close(builder_sock);
    builder_sock = -1;
    builder = -1;
    builder_killed = 0;
    if (answered) return;
    if (request_id(MSG_PEEK) == building) request_id(0); /* never read: taken */
    reply(control, building, "error", 0, "the sandbox could not set up the ruleset (its helper died)");
}

/* The request waiting on the control socket, taken off it and answered with an error. */
static void refuse_request(const char *why) {
    char text[256];
    snprintf(text, sizeof text, "the sandbox could not set up the ruleset: %s", why);
    request_id(0);
    reply(control, building, "error", 0, text);
}

/* A request on the control socket: a child runs jaild.py's `build`, which reads and answers it. */
static void start_builder(void) {
    int pair[2];
    building = request_id(MSG_PEEK);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
        refuse_request(strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        char args[5][16], source[32];
        snprintf(args[0], 16, "%d", control);
        snprintf(args[1], 16, "%d", state_fd);
        snprintf(args[2], 16, "%d", pair[1]);
        snprintf(args[3], 16, "%d", python_fd);
        snprintf(args[4], 16, "%d", source_fd);
        snprintf(source, sizeof source, "/proc/self/fd/%d", source_fd);
        fcntl(pair[1], F_SETFD, 0);
        fcntl(control, F_SETFD, 0); /* it reads the request itself, and answers it */
        fcntl(state_fd, F_SETFD, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Our environment is PYTHONHOME alone: the standard library where ollie's Python has it
           (read-only in every jail), never one found by a search a program could plant a file on. */
        char *argv[] = {python_path, "-s", "-S", "-P", source, "build", args[0], args[1], args[2], args[3], args[4], NULL};
        syscall(SYS_execveat, python_fd, "", argv, environ, AT_EMPTY_PATH);
        _exit(127);
    }
    close(pair[1]);
    if (pid < 0) {
        int e = errno;
        close(pair[0]);
        refuse_request(strerror(e));
        return;
    }
    builder_sock = pair[0];
    builder = pid;
    builder_deadline = now() + BUILD_SECONDS;
}

static void reap(void) {
    for (;;) {
        siginfo_t info = {0};
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0) return;
        pid_t pid = info.si_pid;
        struct stage *s = find_stage(pid);
        struct channel *channel = s ? s->channel : NULL;
        unsigned long id = s ? s->id : 0;
        char *error = NULL;
        if (s) {
            kill_group(pid); /* before the reap: until then the group's id cannot be reused */
            while (s->report >= 0 && read_report(s)) { /* it has exited: what it wrote is there */
            }
            error = s->error, s->error = NULL;
            drop_stage(s);
        }
        int handler = is_handler(pid);
        for (size_t i = 0; i < n_handlers; i++)
            if (handlers[i].pid == pid) handlers[i] = handlers[--n_handlers];
        int status;
        waitpid(pid, &status, 0);
        if (pid == builder) end_builder();
        if (channel && error) reply(channel->sock, id, "error", 0, error);
        else if (channel)
            reply(channel->sock, id, "status", WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), NULL);
        free(error);
        if (!handler) sweep(); /* a stage's end, or a stray's: not a connect's, which a daemon outlives */
    }
}

static void end_all(void) {
    if (builder > 0) kill(builder, SIGKILL); /* not a stage: no sweep would find it */
    while (n_channels) end_channel(n_channels - 1);
    if (pid_one) {
        kill(-1, SIGKILL);
        while (wait(NULL) > 0 || errno == EINTR) {
        }
    } else {
        sweep();
    }
    exit(0);
}

int main(int argc, char **argv) {
    if (argc < 7) return 2;
    control = atoi(argv[1]);
    unsigned long tmp_device, shm_device;
    pid_one = atoi(argv[2]);
    own_network = sscanf(argv[2], "2,%lu,%lu", &tmp_device, &shm_device) == 2;
    if (own_network) jail_devices[0] = (dev_t)tmp_device, jail_devices[1] = (dev_t)shm_device;
    state_fd = atoi(argv[3]);
    python_fd = atoi(argv[4]);
    python_path = argv[5];
    source_fd = atoi(argv[6]);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* execve made us dumpable again */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL); /* Python ignored SIGPIPE, SIGXFSZ: not its programs */
    if (!pid_one) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    fcntl(control, F_SETFD, FD_CLOEXEC);
    fcntl(state_fd, F_SETFD, FD_CLOEXEC); /* a build's child is given both */
    can_supervise = probe_supervision(); /* before our signals are blocked for the signalfd */
    for (int i = 7; i < argc; i++) {
        int sock, ruleset, seccomp, supervised;
        if (sscanf(argv[i], "%d,%d,%d,%d", &sock, &ruleset, &seccomp, &supervised) == 4)
            add_channel(sock, ruleset, seccomp, supervised);
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", getpid());
    children_fd = open(path, O_RDONLY | O_CLOEXEC);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGXCPU);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int signals = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals < 0) return 1;
    reap(); /* what exited before we were here */
    struct pollfd *polled = NULL;
    pid_t *reporting = NULL; /* the stage whose report socket or listener each entry past the channels' is */
    for (;;) {
        size_t n = 0, polled_channels = n_channels, n_reporting = 0;
        double soonest = 1e300; /* when a handler will have waited long enough to count no more */
        polled = grow(polled, n_channels + 2 * n_stages + 2, sizeof *polled);
        reporting = grow(reporting, 2 * n_stages, sizeof *reporting);
        polled[n++] = (struct pollfd){signals, POLLIN, 0};
        /* While a build runs, its request waits on the socket: only the socket's end counts. */
        polled[n++] = (struct pollfd){control, builder < 0 ? POLLIN : POLLRDHUP, 0};
        for (size_t i = 0; i < n_channels; i++) polled[n++] = (struct pollfd){channels[i]->sock, POLLIN, 0};
        for (size_t j = 0; j < n_stages; j++)
            for (int k = 0; k < 2; k++) {
                int fd = k ? stages[j].listener : stages[j].report;
                if (fd < 0 || (k && !may_supervise(stages[j].pid, &soonest))) continue;
                polled[n++] = (struct pollfd){fd, POLLIN, 0};
                reporting[n_reporting++] = stages[j].pid;
            }
        int wait_ms = -1;
        if (builder >= 0 && !builder_killed) {
            double left = builder_deadline - now();
            wait_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        if (soonest < 1e300) {
            double left = soonest - now();
            int ms = left > 0 ? (int)(left * 1000) + 1 : 0;
            if (wait_ms < 0 || ms < wait_ms) wait_ms = ms;
        }
        if (poll(polled, n, wait_ms) < 0) continue;
        if (builder >= 0 && !builder_killed && now() >= builder_deadline) {
            kill(builder, SIGKILL); /* reaped, and its request answered, as it ends */
            builder_killed = 1;
        }
        if (polled[0].revents) {
            struct signalfd_siginfo info;
            while (read(signals, &info, sizeof info) == sizeof info) {
                if (info.ssi_signo == SIGXCPU) retire(); /* our CPU limit */
            }
            reap();
        }
        if (polled[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) end_all();
        if (polled[1].revents & POLLIN && builder < 0) {
            char byte;
            ssize_t got = recv(control, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) end_all();
            if (got > 0) start_builder();
        }
        for (size_t i = polled_channels; i-- > 0;)
            if (i < n_channels && polled[2 + i].revents && polled[2 + i].fd == channels[i]->sock) serve_channel(i);
        for (size_t k = 0; k < n_reporting; k++) {
            struct pollfd *p = &polled[2 + polled_channels + k];
            struct stage *s = p->revents ? find_stage(reporting[k]) : NULL;
            if (s && s->report == p->fd) read_report(s);
            else if (s && s->listener == p->fd && p->revents & POLLIN) {
                if (may_supervise(s->pid, NULL)) supervise(s); /* the bounds again: this round took some */
            }
            else if (s && s->listener == p->fd) close(s->listener), s->listener = -1; /* no program of its filter is left */
        }
        if (retiring && n_stages == 0) end_all();
    }
}
