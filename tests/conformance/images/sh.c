/* /bin/sh of the busybox stand-in: busybox's ash, but for `sh -c SCRIPT` whose script
 * is one simple command (words of plain characters, no shell syntax), which it runs
 * directly with the whole environment. Debian's busybox ash drops the variables whose
 * names are no shell names (`data-1`, as a ConfigMap's envFrom gives them) before it
 * runs a command; the real image's shell passes them on. Everything else, the error
 * messages included, is ash's own. */
#include <string.h>
#include <unistd.h>

static int plain(const char *s) {
    int words = 0;
    for (const char *p = s; *p; p++) {
        if (*p == ' ') continue;
        if (p == s || p[-1] == ' ') words++;
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-=:,", *p))
            return 0;
    }
    return words > 0 && words < 32;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "-c") == 0 && plain(argv[2])) {
        char buf[4096], *words[33];
        int n = 0;
        strncpy(buf, argv[2], sizeof buf - 1);
        buf[sizeof buf - 1] = 0;
        for (char *w = strtok(buf, " "); w && n < 32; w = strtok(NULL, " ")) words[n++] = w;
        words[n] = NULL;
        /* `VAR=value cmd` is shell syntax for an environment: leave it to ash. */
        if (!strchr(words[0], '=')) {
            execvp(words[0], words);
        }
    }
    /* busybox picks the applet by argv[0]'s name (sh), and ash prints argv[0] in its
     * messages (/bin/sh: can't create ...), as the real image's shell does. */
    execv("/bin/busybox", argv);
    return 127;
}
