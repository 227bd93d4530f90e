package gate

import (
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// queue is controller-runtime's priority queue with the gate in front of Get: a worker takes a slot
// before it takes an item and gives it back when the item is Done. Waiting for a slot happens in the
// worker's Get, before the reconcile starts, so the reconcile-time histogram keeps measuring reconciles.
type queue struct {
	priorityqueue.PriorityQueue[reconcile.Request]
	g *Gate
}

// NewQueue returns a controller.Options.NewQueue that gates controller-runtime's default queue.
func NewQueue(g *Gate) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		return &queue{PriorityQueue: priorityqueue.New[reconcile.Request](name, func(o *priorityqueue.Opts[reconcile.Request]) {
			o.RateLimiter = rl
		}), g: g}
	}
}

func (q *queue) GetWithPriority() (reconcile.Request, int, bool) {
	if !q.g.Acquire() {
		return reconcile.Request{}, 0, true
	}
	item, priority, shutdown := q.PriorityQueue.GetWithPriority()
	if shutdown {
		// controller-runtime calls Done only for items it processes, and it stops on shutdown.
		q.g.Release()
	}
	return item, priority, shutdown
}

func (q *queue) Get() (reconcile.Request, bool) {
	item, _, shutdown := q.GetWithPriority()
	return item, shutdown
}

func (q *queue) Done(item reconcile.Request) {
	q.PriorityQueue.Done(item)
	q.g.Release()
}

func (q *queue) ShutDown() {
	q.g.Close()
	q.PriorityQueue.ShutDown()
}

func (q *queue) ShutDownWithDrain() {
	q.g.Close()
	q.PriorityQueue.ShutDownWithDrain()
}
