/* Subcommands of the nobubble CLI. Each takes argv with argv[0] = the subcommand name and
 * returns the process exit code (0 ok, 1 runtime error, 2 usage error). */
#ifndef NB_COMMANDS_H
#define NB_COMMANDS_H
int nb_cmd_tokenize(int argc, char **argv); /* tools/cmd_tokenize.c */
int nb_cmd_train(int argc, char **argv);    /* tools/cmd_train.c */
int nb_cmd_eval(int argc, char **argv);     /* tools/cmd_train.c */
int nb_cmd_sample(int argc, char **argv);   /* tools/cmd_sample.c */
int nb_cmd_export(int argc, char **argv);   /* tools/cmd_export.c */
int nb_cmd_predict(int argc, char **argv);  /* tools/cmd_predict.c */
int nb_cmd_criteo_convert(int argc, char **argv); /* tools/cmd_criteo.c */
int nb_cmd_synth_dump(int argc, char **argv);     /* tools/cmd_synth_dump.c */
int nb_cmd_timeline(int argc, char **argv);       /* tools/cmd_timeline.c */
int nb_cmd_plan(int argc, char **argv);           /* tools/cmd_plan.c */
#endif
