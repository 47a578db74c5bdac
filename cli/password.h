/* Passwords given on the capstan command line, which every user of the
 * machine can read (ps, /proc/PID/cmdline). */
#ifndef CAPSTAN_CLI_PASSWORD_H
#define CAPSTAN_CLI_PASSWORD_H

/* Copies each argument before "--" that carries a password (a redis://,
 * rediss:// or unix:// URL, alone or as --flag=URL) for the commands to
 * use, points argv at the copy (kept for the life of the process) and
 * blanks the password in the original bytes, which are what the kernel
 * shows. Arguments after "--" belong to another program. */
void capstan__cli_hide_passwords(int argc, char **argv);

/* 1 once a password was blanked from this process's command line. */
int capstan__cli_password_hidden(void);

/* What to tell the user when one was. */
extern const char capstan__cli_password_warning[];

#endif
