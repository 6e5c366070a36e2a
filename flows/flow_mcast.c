#include "flow_internal.h"
#include "fk_error.h"
int flow__mc_target_init(flow_target *t)
{
    (void)t;
    return FK_EINVAL;
}
void flow__mc_target_free(flow_target *t)
{
    (void)t;
}
int flow__mc_next(flow_target *t, struct flow_item *item, uint64_t deadline)
{
    (void)t;
    (void)item;
    (void)deadline;
    return FK_EINVAL;
}
int flow__mc_source_init(flow_source *s)
{
    (void)s;
    return FK_EINVAL;
}
void flow__mc_source_free(flow_source *s)
{
    (void)s;
}
int flow__mc_push(flow_source *s, const void *tuple)
{
    (void)s;
    (void)tuple;
    return FK_EINVAL;
}
int flow__mc_close(flow_source *s)
{
    (void)s;
    return FK_EINVAL;
}
