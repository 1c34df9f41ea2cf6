/* Intrusive doubly-linked lists: the node struct carries its own link
 * fields, named by the caller, so one struct can sit on several lists
 * (a page chunk is on its partial list and on the list of all chunks).
 * The head is a plain pointer to the first node, NULL when empty.
 */

#ifndef ZSALLOC_DLIST_H
#define ZSALLOC_DLIST_H

#include <stddef.h>

/* Insert node at the front of the list at head. */
#define DLIST_PUSH(head, node, prev, next)      \
  do {                                          \
    (node)->prev = NULL;                        \
    (node)->next = (head);                      \
    if ((head))                                 \
      (head)->prev = (node);                    \
    (head) = (node);                            \
  } while (0)

/* Remove node from the list at head. */
#define DLIST_REMOVE(head, node, prev, next)    \
  do {                                          \
    if ((node)->prev)                           \
      (node)->prev->next = (node)->next;        \
    else                                        \
      (head) = (node)->next;                    \
    if ((node)->next)                           \
      (node)->next->prev = (node)->prev;        \
    (node)->prev = (node)->next = NULL;         \
  } while (0)

#endif /* ZSALLOC_DLIST_H */
