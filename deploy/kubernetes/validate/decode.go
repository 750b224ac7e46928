package validate

import (
	"fmt"
	"regexp"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kinds are the API types a manifest may have, by "apiVersion/kind".
var kinds = map[string]func() any{
	"v1/Namespace":                  func() any { return &corev1.Namespace{} },
	"v1/Service":                    func() any { return &corev1.Service{} },
	"v1/ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                     func() any { return &corev1.Secret{} },
	"v1/Pod":                        func() any { return &corev1.Pod{} },
	"apps/v1/Deployment":            func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// Decode strictly decodes one YAML document into the API type its apiVersion and kind name:
// an unknown field, a duplicate key or a value of the wrong type is an error.
func Decode(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("read apiVersion and kind: %w", err)
	}
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q: not a type this repository deploys", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// SplitDocuments splits a multi-document YAML stream at its "---" lines, dropping documents
// that hold only comments.
func SplitDocuments(data []byte) ([][]byte, error) {
	var docs [][]byte
	for _, doc := range separator.Split(string(data), -1) {
		var v any
		if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, []byte(doc))
		}
	}
	return docs, nil
}
