/* The jail's PID 1 once its setup is done: a small native program, so that a jail between
 * stages costs a few pages, not a Python process (jaild.py, which sets the jail up and opens its
 * first ruleset's channel, then execs this; see that file for the protocol).
 *
 *   ollie-jail-init CONTROL PID_ONE STATE PYTHON PYTHON_PATH SOURCE [SOCK,RULESET,SECCOMP ...]
 *
 * CONTROL is the parent's socket, PID_ONE 1 for a PID namespace's init (0: a subreaper, the
 * kernel refused namespaces), STATE a memfd of the jail's mounts (jaild.py's, opaque here),
 * PYTHON a descriptor of the interpreter (PYTHON_PATH its path, its argv[0]), SOURCE one of
 * jaild.py, and each channel its socket, its Landlock ruleset (-1: none) and a memfd of its
 * seccomp program (-1: none). The environment is PYTHONHOME alone, for the builds.
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
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#define MAX_FDS 8
#define BUILD_SECONDS 60 /* a build that takes longer is killed, its request answered */

struct channel {
    int sock, ruleset;
    struct sock_fprog prog; /* len 0: no seccomp program */
    int prog_broken;        /* one was given and could not be read: its stages are refused, never run without it */
};

struct stage {
    pid_t pid;
    struct channel *channel;
    unsigned long id;
    int report;  /* the pipe its child reports a failure to start on, until it closes (-1 since) */
    char *error; /* what that failure was, answered for it when it is reaped */
};

static int control, pid_one, state_fd, python_fd, source_fd;
static char *python_path;
static struct channel **channels;
static size_t n_channels;
static struct stage *stages;
static size_t n_stages;
static pid_t builder = -1; /* the Python child building a channel */
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

/* Kill our children that are neither a running program nor in one's group, nor the builder. */
static void sweep(void) {
    char list[65536], path[64], stat[1024];
    ssize_t n = pread(children_fd, list, sizeof list - 1, 0);
    if (n <= 0) return;
    list[n] = 0;
    for (char *tok = strtok(list, " \n"); tok; tok = strtok(NULL, " \n")) {
        pid_t pid = (pid_t)atol(tok);
        if (pid <= 0 || pid == builder || find_stage(pid)) continue;
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

/* What the child reported, if it has (its end of the pipe is closed once it execs or exits). */
static void read_report(struct stage *s) {
    char text[4200];
    ssize_t n = read(s->report, text, sizeof text - 1);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
        text[n] = 0;
        free(s->error);
        s->error = strdup(text);
    }
    close(s->report);
    s->report = -1;
}

static void drop_stage(struct stage *s) {
    if (s->report >= 0) close(s->report);
    free(s->error);
    *s = stages[--n_stages];
}

static void end_channel(size_t i) {
    struct channel *c = channels[i];
    for (size_t j = 0; j < n_stages; j++)
        if (stages[j].channel == c) kill_group(stages[j].pid), stages[j].channel = NULL;
    close(c->sock);
    if (c->ruleset >= 0) close(c->ruleset);
    free(c->prog.filter);
    free(c);
    channels[i] = channels[--n_channels];
}

/* The seccomp program in memfd `fd` (closed), or none; `broken` set if one was given and not read. */
static struct sock_fprog load_program(int fd, int *broken) {
    struct sock_fprog prog = {0, NULL};
    struct stat st;
    *broken = 0;
    if (fd < 0) return prog;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && st.st_size % sizeof(struct sock_filter) == 0 &&
        st.st_size / sizeof(struct sock_filter) <= BPF_MAXINSNS) {
        prog.filter = malloc(st.st_size);
        if (prog.filter && pread(fd, prog.filter, st.st_size, 0) == st.st_size)
            prog.len = st.st_size / sizeof(struct sock_filter);
    }
    close(fd);
    *broken = prog.len == 0;
    return prog;
}

static void add_channel(int sock, int ruleset, int seccomp) {
    struct channel *c = malloc(sizeof *c);
    if (!c) _exit(70);
    c->sock = sock;
    c->ruleset = ruleset;
    c->prog = load_program(seccomp, &c->prog_broken);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    if (ruleset >= 0) fcntl(ruleset, F_SETFD, FD_CLOEXEC);
    channels = grow(channels, n_channels, sizeof *channels);
    channels[n_channels++] = c;
}

enum { AT_CWD = 1, AT_EXEC, AT_CONFINE };

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
    if (c->prog_broken) {
        errno = EINVAL; /* its seccomp program could not be read */
        goto fail;
    }
    if (c->prog.len && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &c->prog) < 0) goto fail;
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
    if (pipe2(report, O_CLOEXEC) < 0) {
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
    stages[n_stages++] = (struct stage){pid, c, id, report[0], NULL};
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

/* The builder's end: its channel and the mounts' new state taken ("A C R S T": see jaild.py's
   `build`), and, if it did not answer (Python would not start, or died), the request answered
   here (and taken off the socket if it was never read). */
static void end_builder(void) {
    char buf[64];
    int fds[MAX_FDS], n_fds, f[5] = {0};
    int n = receive(builder_sock, buf, sizeof buf - 1, fds, &n_fds, 0);
    buf[n > 0 ? n : 0] = 0;
    int well_formed = n > 0 && sscanf(buf, "%d %d %d %d %d", &f[0], &f[1], &f[2], &f[3], &f[4]) == 5 &&
                      n_fds == !!f[1] + !!f[2] + !!f[3] + !!f[4];
    int answered = well_formed && f[0], k = 0; /* it read the request and answered it */
    if (well_formed) {
        int sock = f[1] ? fds[k++] : -1, ruleset = f[2] ? fds[k++] : -1, seccomp = f[3] ? fds[k++] : -1;
        if (sock >= 0) add_channel(sock, ruleset, seccomp);
        if (f[4]) close(state_fd), state_fd = fds[k++]; /* what the next build goes on from */
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
            if (s->report >= 0) read_report(s); /* it has exited: what it wrote is there */
            error = s->error, s->error = NULL;
            drop_stage(s);
        }
        int status;
        waitpid(pid, &status, 0);
        if (pid == builder) end_builder();
        if (channel && error) reply(channel->sock, id, "error", 0, error);
        else if (channel)
            reply(channel->sock, id, "status", WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), NULL);
        free(error);
        sweep();
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
    pid_one = atoi(argv[2]);
    state_fd = atoi(argv[3]);
    python_fd = atoi(argv[4]);
    python_path = argv[5];
    source_fd = atoi(argv[6]);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* execve made us dumpable again */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL); /* Python ignored SIGPIPE, SIGXFSZ: not its programs */
    if (!pid_one) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    fcntl(control, F_SETFD, FD_CLOEXEC);
    fcntl(state_fd, F_SETFD, FD_CLOEXEC); /* a build's child is given both */
    for (int i = 7; i < argc; i++) {
        int sock, ruleset, seccomp;
        if (sscanf(argv[i], "%d,%d,%d", &sock, &ruleset, &seccomp) == 3) add_channel(sock, ruleset, seccomp);
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
    pid_t *reporting = NULL; /* the stage whose report pipe each entry past the channels' is */
    for (;;) {
        size_t n = 0, polled_channels = n_channels, n_reporting = 0;
        polled = grow(polled, n_channels + n_stages + 2, sizeof *polled);
        reporting = grow(reporting, n_stages, sizeof *reporting);
        polled[n++] = (struct pollfd){signals, POLLIN, 0};
        /* While a build runs, its request waits on the socket: only the socket's end counts. */
        polled[n++] = (struct pollfd){control, builder < 0 ? POLLIN : POLLRDHUP, 0};
        for (size_t i = 0; i < n_channels; i++) polled[n++] = (struct pollfd){channels[i]->sock, POLLIN, 0};
        for (size_t j = 0; j < n_stages; j++)
            if (stages[j].report >= 0) {
                polled[n++] = (struct pollfd){stages[j].report, POLLIN, 0};
                reporting[n_reporting++] = stages[j].pid;
            }
        int wait_ms = -1;
        if (builder >= 0 && !builder_killed) {
            double left = builder_deadline - now();
            wait_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
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
            struct stage *s = polled[2 + polled_channels + k].revents ? find_stage(reporting[k]) : NULL;
            if (s && s->report == polled[2 + polled_channels + k].fd) read_report(s);
        }
        if (retiring && n_stages == 0) end_all();
    }
}
