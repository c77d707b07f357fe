/* runtime/cli/commands.h — the subcommands implemented in runtime/ (calling convention: common/cli.h). */
#ifndef KVP_RUNTIME_COMMANDS_H
#define KVP_RUNTIME_COMMANDS_H

int kvp_cmd_plan(int argc, char **argv);
int kvp_cmd_simulate(int argc, char **argv);
int kvp_cmd_generate(int argc, char **argv);
int kvp_cmd_serve(int argc, char **argv);
int kvp_cmd_tokenize(int argc, char **argv);

#endif
