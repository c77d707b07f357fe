/* common/log.h — leveled logging to stderr (data goes to stdout, logs never do).
 * The level starts from the environment variable KVPAGE_LOG (error|warn|info|debug; default warn). */
#ifndef KVP_COMMON_LOG_H
#define KVP_COMMON_LOG_H

typedef enum { KVP_LOG_ERROR = 0, KVP_LOG_WARN, KVP_LOG_INFO, KVP_LOG_DEBUG } kvp_log_level;

void kvp_log_set_level(kvp_log_level level);
kvp_log_level kvp_log_get_level(void);
void kvp_log(kvp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define KVP_LOG_E(...) kvp_log(KVP_LOG_ERROR, __VA_ARGS__)
#define KVP_LOG_W(...) kvp_log(KVP_LOG_WARN, __VA_ARGS__)
#define KVP_LOG_I(...) kvp_log(KVP_LOG_INFO, __VA_ARGS__)
#define KVP_LOG_D(...) kvp_log(KVP_LOG_DEBUG, __VA_ARGS__)

#endif
