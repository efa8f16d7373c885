/* Subcommands of the glmtrain binary; each takes the arguments after its name. */
#ifndef GLM_COMMANDS_H
#define GLM_COMMANDS_H
int glm_cmd_train(int argc, char **argv);
int glm_cmd_generate(int argc, char **argv);
int glm_cmd_chat(int argc, char **argv);
int glm_cmd_eval(int argc, char **argv);
int glm_cmd_serve(int argc, char **argv);    /* cli/cmd_serve.c */
int glm_cmd_info(int argc, char **argv);
int glm_cmd_convert(int argc, char **argv);  /* cli/cmd_convert.c */
int glm_cmd_expand(int argc, char **argv);   /* cli/cmd_expand.c */
int glm_cmd_merge(int argc, char **argv);    /* cli/cmd_merge.c */
int glm_cmd_quantize(int argc, char **argv); /* cli/cmd_quantize.c */
int glm_cmd_env(int argc, char **argv);
int glm_cmd_tokenize(int argc, char **argv); /* cli/cmd_tokenize.c */
#endif
