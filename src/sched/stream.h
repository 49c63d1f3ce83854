/* The stream schedule's pieces, shared by its step (stream.c) and its memory plan
 * (stream_plan.c). Everything else reaches the schedule through its registry table. */
#ifndef NB_SCHED_STREAM_H
#define NB_SCHED_STREAM_H

#include <stddef.h>

#include "run/tf.h"

/* Setup of the device slots, pinned slabs and lanes (other_device_bytes: what the run's plan
 * already holds on the device, checked against what was free before it). */
void nb_stream_init(nb_tf_train *tr, size_t other_device_bytes);
void nb_stream_free(nb_tf_train *tr);
nb_mark nb_stream_step(nb_tf_train *tr, int step);
/* One line: what crossed PCIe in the last step (layer uploads, bytes each way). */
void nb_stream_report(const nb_tf_train *tr);
/* Device bytes the stream schedule allocates besides the activations (resident part, slots),
 * with wslots weight slots and glayers layers on the device; nb_stream_wslot_bytes and
 * nb_stream_glayer_bytes: what one more weight slot, one more device layer takes. */
size_t nb_stream_device_need(const nb_tf_model *m, int wslots, int glayers, size_t elem_size);
size_t nb_stream_wslot_bytes(const nb_tf_model *m, size_t elem_size);
size_t nb_stream_glayer_bytes(const nb_tf_model *m, size_t elem_size);

#endif
