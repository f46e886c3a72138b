/* nc: busybox's nc with the UDP mode the stand-in images lack. `nc [-v] -u [-w SECS]
 * [-p PORT] HOST PORT` sends stdin as datagrams to HOST:PORT (a numeric address) and
 * prints what comes back until SECS pass with nothing (1 s by default); any other use
 * goes to busybox nc. */
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int udp = 0, wait = 1, local = 0, i;
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        for (char *o = argv[i] + 1; *o; o++) {
            if (*o == 'u') udp = 1;
            else if (*o == 'v') continue;
            else if ((*o == 'w' || *o == 'p') && !o[1] && i + 1 < argc) {
                int v = atoi(argv[++i]);
                if (*o == 'w') wait = v > 0 ? v : 1; else local = v;
                break;
            } else { udp = 0; i = argc; break; }
        }
    }
    if (!udp || argc - i != 2) {
        char **args = calloc(argc + 2, sizeof *args);
        if (!args) return 127;
        args[0] = "busybox";
        args[1] = "nc";
        for (int j = 1; j < argc; j++) args[j + 1] = argv[j];
        execv("/bin/busybox", args);
        perror("nc: exec /bin/busybox");
        return 127;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICHOST}, *ai;
    if (getaddrinfo(argv[i], argv[i + 1], &hints, &ai) != 0) {
        fprintf(stderr, "nc: bad address %s %s\n", argv[i], argv[i + 1]);
        return 1;
    }
    int s = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (s < 0) { perror("nc: socket"); return 1; }
    if (local) {
        struct sockaddr_storage a = {0};
        a.ss_family = ai->ai_family;
        ((struct sockaddr_in *)&a)->sin_port = htons(local);
        if (bind(s, (struct sockaddr *)&a, ai->ai_addrlen) < 0) { perror("nc: bind"); return 1; }
    }
    if (connect(s, ai->ai_addr, ai->ai_addrlen) < 0) { perror("nc: connect"); return 1; }
    char buf[65536];
    ssize_t n;
    while ((n = read(0, buf, sizeof buf)) > 0)
        if (send(s, buf, n, 0) < 0) { perror("nc: send"); return 1; }
    struct pollfd p = {.fd = s, .events = POLLIN};
    while (poll(&p, 1, wait * 1000) > 0) {
        n = recv(s, buf, sizeof buf, 0);
        if (n <= 0) break;
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
    }
    return 0;
}
