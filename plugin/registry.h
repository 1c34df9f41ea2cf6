/* The server's entry in the registry (registry-dir.h): what makes it
 * appear in `nbdkit-zramctl` with no arguments.
 *
 * Called from .get_ready (registry_default_ctl), from the control
 * channel as it starts listening (registry_add) and as it stops
 * (registry_remove): one thread at a time.
 */
#ifndef ZRAM_REGISTRY_H
#define ZRAM_REGISTRY_H

/* The control socket a server given no ctl= listens on: the registry's
 * NAME.ctl (malloc'd; name: the server's name=, NULL without one), or
 * NULL when this user has no registry (the server then has no control
 * channel, as before there was one).
 */
extern char *registry_default_ctl (const char *name);
/* Register the control socket at ctl_path under name (NULL: none):
 * nothing to do when
 * it is in the registry already (registry_default_ctl's), else a link
 * there to it.  A registry that cannot be written is logged (debug) and
 * skipped: the server serves all the same.
 */
extern void registry_add (const char *name, const char *ctl_path);
/* Remove the link registry_add made, if it is still the one it made. */
extern void registry_remove (void);

#endif /* ZRAM_REGISTRY_H */
