package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Selector turns the node selector into a labels.Selector. A nil or empty selector matches every node.
// Admission validation makes an error unlikely, but objects written before a schema change still get one.
func (s *NodeSelector) Selector() (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	ls := &metav1.LabelSelector{MatchLabels: make(map[string]string, len(s.MatchLabels))}
	for k, v := range s.MatchLabels {
		ls.MatchLabels[k] = string(v)
	}
	for _, e := range s.MatchExpressions {
		r := metav1.LabelSelectorRequirement{Key: e.Key, Operator: metav1.LabelSelectorOperator(e.Operator)}
		for _, v := range e.Values {
			r.Values = append(r.Values, string(v))
		}
		ls.MatchExpressions = append(ls.MatchExpressions, r)
	}
	return metav1.LabelSelectorAsSelector(ls)
}
