// helm-render renders a Helm chart the way `helm template` does, without
// Helm: the same template engine (Go text/template with sprig v3's
// TxtFuncMap, minus env/expandenv) and Helm's own template functions and
// rendering rules, re-implemented here from Helm's documented behaviour and
// its engine source (pkg/engine, pkg/chart/common/util, pkg/release/v1/util).
// It exists so that CI can render helm/samsa and validate every object
// without a Helm binary, which cannot be installed offline.
//
// Reproduced:
//   - every file under templates/ parsed into one template set (named
//     "<chart name>/templates/<path>", parsed in Helm's order: fewer path
//     segments first, then by name), so defines in _*.tpl are shared; files
//     whose base name starts with "_" are not rendered; option
//     missingkey=zero, then every "<no value>" in the output replaced by "";
//   - include (with Helm's recursion limit), tpl (a clone of the template
//     set, missingkey re-applied, include/tpl re-bound), required and fail
//     (message wrapped so the error reads "execution error at (file:line:col):
//     msg"), toYaml/mustToYaml (sigs.k8s.io/yaml, trailing newline trimmed),
//     fromYaml, fromYamlArray, toJson/mustToJson, fromJson, fromJsonArray,
//     toToml/mustToToml/fromToml (BurntSushi/toml), lookup (an empty map, as
//     `helm template` has no cluster), getHostByName ("" as without
//     --enable-dns);
//   - values: values.yaml (multi-document, merged) then each -f file in
//     order merged over the previous ones (maps recursively, anything else
//     replaced), then coalesced with the chart's defaults as Helm does (a
//     null deletes the default; nulls in defaults are dropped); then checked
//     against values.schema.json (JSON Schema, xeipuuv/gojsonschema, the
//     library Helm 3 used up to 3.17) before anything is rendered;
//   - .Release (Name, Namespace, IsInstall true, IsUpgrade false, Revision 1,
//     Service "Helm"), .Chart (Chart.yaml, Go field names: Name, Version,
//     AppVersion, ...), .Capabilities (KubeVersion.Version/Major/Minor,
//     APIVersions.Has, HelmVersion), .Template (Name, BasePath), .Files (Get,
//     GetBytes, Lines over the chart's non-template files);
//   - Chart.yaml's kubeVersion constraint checked against --kube-version;
//   - the output of `helm template`: NOTES.txt taken out (written with
//     --notes-out), each file split into documents on lines starting with
//     "---", whitespace-only documents dropped, each document parsed as YAML
//     (a parse error fails like Helm's "YAML parse error on ..."), documents
//     ordered by Helm's install order of kinds (stable), each printed as
//     "---\n# Source: <file>\n<document>\n".
//
// Not reproduced: subcharts and dependencies (refused), hooks (rendered as
// ordinary manifests), .helmignore, --set parsing, Files.Glob/AsConfig/
// AsSecrets, Helm's multi-line reformatting of non-`fail` execution errors
// (the text/template error is printed as is), post-renderers.
//
// Where Helm 3 and Helm 4 differ this follows Helm 4 (e.g. a document keeps
// its trailing newlines; Helm 3 trimmed them): the YAML is the same.
//
// Build: GOPATH mode over Debian's /usr/share/gocode, with a small GOPATH
// that links sprig and semver under the /v3 paths they are imported by;
// tests/deploy/helm.sh does it (and names the Debian packages):
//
//	GO111MODULE=off GOPATH=$OVERLAY:/usr/share/gocode go build -o helm-render ./tests/deploy/helm-render
//
// Use:
//
//	helm-render [--name R] [--namespace NS] [--kube-version v1.x.y]
//	            [--api-versions g/v,...] [-f values.yaml]... [--notes-out F] CHART_DIR
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"unicode"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/semver/v3"
	"github.com/Masterminds/sprig/v3"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

// ---------------------------------------------------------------- values

// Values is the type of the top-level render context and of .Values, as in
// Helm (nested tables are plain maps).
type Values map[string]interface{}

// YAML renders the values as YAML (Helm's Values.YAML).
func (v Values) YAML() (string, error) {
	b, err := yaml.Marshal(v)
	return string(b), err
}

// AsMap returns the values as a plain map (Helm's Values.AsMap).
func (v Values) AsMap() map[string]interface{} {
	if len(v) == 0 {
		return map[string]interface{}{}
	}
	return v
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// loadValues reads a values file: one or more YAML documents, merged.
func loadValues(data []byte) (map[string]interface{}, error) {
	out := map[string]interface{}{}
	for _, doc := range docSep.Split(string(data), -1) {
		cur := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(doc), &cur); err != nil {
			return nil, fmt.Errorf("cannot unmarshal yaml document: %w", err)
		}
		out = mergeMaps(out, cur)
	}
	return out, nil
}

// mergeMaps merges b over a: tables recursively, anything else (null
// included) replaces (Helm's loader.MergeMaps, used between -f files).
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(bv, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func deepCopy(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, e := range t {
			m[k] = deepCopy(e)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, e := range t {
			l[i] = deepCopy(e)
		}
		return l
	default:
		return v
	}
}

func isTable(v interface{}) bool {
	_, ok := v.(map[string]interface{})
	return ok
}

func cleanNilValues(m map[string]interface{}) {
	for k, v := range m {
		if v == nil {
			delete(m, k)
		} else if sub, ok := v.(map[string]interface{}); ok {
			cleanNilValues(sub)
		}
	}
}

// coalesceValues merges the chart's defaults into the user's values (user
// wins; a user null deletes the default), as Helm's coalesceValues does for
// a chart without dependencies.
func coalesceValues(user, defaults map[string]interface{}) map[string]interface{} {
	v := deepCopy(user).(map[string]interface{})
	dc := deepCopy(defaults).(map[string]interface{})
	for key, val := range dc {
		if value, ok := v[key]; ok {
			if value == nil {
				delete(v, key)
			} else if dest, ok := value.(map[string]interface{}); ok {
				if src, ok := val.(map[string]interface{}); ok {
					cleanNilValues(src)
					coalesceTables(dest, src, key)
				} else if val != nil {
					warnf("warning: skipped value for %s: Not a table.", key)
				}
			}
		} else {
			if val == nil {
				continue
			}
			if sub, ok := val.(map[string]interface{}); ok {
				cleanNilValues(sub)
			}
			v[key] = val
		}
	}
	return v
}

// coalesceTables merges src (defaults) into dst (user's), as Helm's
// coalesceTablesFullKey with merge=false.
func coalesceTables(dst, src map[string]interface{}, prefix string) {
	srcNonNil := map[string]bool{}
	for k, v := range src {
		if v != nil {
			srcNonNil[k] = true
		}
	}
	for k, v := range dst {
		if v == nil {
			src[k] = nil
		}
	}
	for k, val := range src {
		full := prefix + "." + k
		dv, ok := dst[k]
		switch {
		case ok && dv == nil && srcNonNil[k]:
			delete(dst, k)
		case !ok:
			dst[k] = val
		case isTable(val):
			if isTable(dv) {
				coalesceTables(dv.(map[string]interface{}), val.(map[string]interface{}), full)
			} else {
				warnf("warning: cannot overwrite table with non table for %s (%v)", full, val)
			}
		case isTable(dv) && val != nil:
			warnf("warning: destination for %s is a table. Ignoring non-table value (%v)", full, val)
		}
	}
}

func warnf(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
}

// validateSchema checks the coalesced values against values.schema.json, as
// Helm 3's ValidateAgainstSingleSchema (values → YAML → JSON, gojsonschema).
func validateSchema(chartName string, vals map[string]interface{}, schema []byte) error {
	y, err := yaml.Marshal(vals)
	if err != nil {
		return err
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return err
	}
	if bytes.Equal(j, []byte("null")) {
		j = []byte("{}")
	}
	res, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(j))
	if err != nil {
		return fmt.Errorf("%s: invalid values.schema.json: %w", chartName, err)
	}
	if res.Valid() {
		return nil
	}
	var sb strings.Builder
	for _, e := range res.Errors() {
		fmt.Fprintf(&sb, "- %s\n", e)
	}
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", chartName, sb.String())
}

// ----------------------------------------------------------------- chart

// Maintainer and Dependency mirror Helm's chart.Maintainer/Dependency.
type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
	URL   string `json:"url,omitempty"`
}

type Dependency struct {
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	Repository string `json:"repository"`
}

// Metadata mirrors the fields of Helm's chart.Metadata (Chart.yaml); .Chart
// is this struct turned into a map keyed by field name, as Helm 4 does.
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []*Maintainer     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []*Dependency     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

func structToMap(obj interface{}) map[string]interface{} {
	v := reflect.ValueOf(obj)
	if v.Kind() == reflect.Ptr {
		v = v.Elem()
	}
	out := map[string]interface{}{}
	t := v.Type()
	for i := 0; i < v.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		switch fv.Kind() {
		case reflect.Ptr:
			if fv.IsNil() {
				out[f.Name] = nil
			} else {
				out[f.Name] = structToMap(fv.Interface())
			}
		case reflect.Slice:
			l := make([]interface{}, fv.Len())
			for j := range l {
				e := fv.Index(j)
				if e.Kind() == reflect.Ptr || e.Kind() == reflect.Struct {
					l[j] = structToMap(e.Interface())
				} else {
					l[j] = e.Interface()
				}
			}
			out[f.Name] = l
		default:
			out[f.Name] = fv.Interface()
		}
	}
	return out
}

// Files is .Files: the chart's files outside templates/ (Helm's files type).
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f.GetBytes(name)) }
func (f Files) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(string(f[name]), "\n"), "\n")
}

type chart struct {
	meta      Metadata
	values    map[string]interface{}
	schema    []byte
	templates map[string]string // "<name>/templates/<rel>" → text
	files     Files
}

func loadChart(dir string) (*chart, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	c := &chart{templates: map[string]string{}, files: Files{}}
	if err := yaml.Unmarshal(raw, &c.meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %w", err)
	}
	if c.meta.APIVersion != "v2" || c.meta.Name == "" || c.meta.Version == "" {
		return nil, errors.New("Chart.yaml: apiVersion v2, name and version are required")
	}
	if len(c.meta.Dependencies) > 0 {
		return nil, errors.New("charts with dependencies are not supported by this renderer")
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.yaml")); err == nil {
		if c.values, err = loadValues(raw); err != nil {
			return nil, fmt.Errorf("values.yaml: %w", err)
		}
	} else {
		c.values = map[string]interface{}{}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		c.schema = raw
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "charts" {
				return errors.New("charts with subcharts (charts/) are not supported by this renderer")
			}
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			c.templates[path.Join(c.meta.Name, rel)] = string(data)
		case rel == "Chart.yaml" || rel == "Chart.lock" || rel == "values.yaml" || rel == "values.schema.json":
		default:
			c.files[rel] = data
		}
		return nil
	})
	return c, err
}

// ---------------------------------------------------------- capabilities

type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

func (k *KubeVersion) String() string     { return k.Version }
func (k *KubeVersion) GitVersion() string { return k.Version }

type VersionSet []string

func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

type HelmVersion struct {
	Version      string
	GitCommit    string
	GitTreeState string
	GoVersion    string
}

type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion HelmVersion
}

// The built-in API group versions of a current Kubernetes (what Helm's
// default version set lists from client-go's scheme, less the alpha/beta
// groups this chart never asks for).
var builtinAPIVersions = []string{
	"v1", "admissionregistration.k8s.io/v1", "apiextensions.k8s.io/v1",
	"apiregistration.k8s.io/v1", "apps/v1", "authentication.k8s.io/v1",
	"authorization.k8s.io/v1", "autoscaling/v1", "autoscaling/v2", "batch/v1",
	"certificates.k8s.io/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1",
	"events.k8s.io/v1", "flowcontrol.apiserver.k8s.io/v1", "networking.k8s.io/v1",
	"node.k8s.io/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
	"resource.k8s.io/v1", "scheduling.k8s.io/v1", "storage.k8s.io/v1",
}

var kubeVersionRe = regexp.MustCompile(`^v?([0-9]+)\.([0-9]+)(\.[0-9]+)?`)

// --------------------------------------------------------------- engine

const (
	warnStart        = "HELM_ERR_START"
	warnEnd          = "HELM_ERR_END"
	recursionMaxNums = 1000
)

var warnRegex = regexp.MustCompile(warnStart + `((?s).*)` + warnEnd)

func warnWrap(s string) string { return warnStart + s + warnEnd }

func includeFun(t *template.Template, names map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		if n, ok := names[name]; ok {
			if n > recursionMaxNums {
				return "", fmt.Errorf("rendering template has a nested reference name: %s: unable to execute template", name)
			}
			names[name]++
		} else {
			names[name] = 1
		}
		err := t.ExecuteTemplate(&buf, name, data)
		names[name]--
		return buf.String(), err
	}
}

func tplFun(parent *template.Template, names map[string]int) func(string, interface{}) (string, error) {
	return func(text string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %w", err)
		}
		t.Option("missingkey=zero")
		t.Funcs(template.FuncMap{
			"include": includeFun(t, names),
			"tpl":     tplFun(t, names),
		})
		t, err = t.New(parent.Name()).Parse(text)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", text, err)
		}
		var buf strings.Builder
		if err := t.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

func toYAML(v interface{}) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

func mustToYAML(v interface{}) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		panic(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(s string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(s), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toTOML(v interface{}) string {
	b := bytes.NewBuffer(nil)
	if err := toml.NewEncoder(b).Encode(v); err != nil {
		return err.Error()
	}
	return b.String()
}

func mustToTOML(v interface{}) string {
	b := bytes.NewBuffer(nil)
	if err := toml.NewEncoder(b).Encode(v); err != nil {
		panic(err)
	}
	return b.String()
}

func fromTOML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := toml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

func mustToJSON(v interface{}) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(s string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func funcMap(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	names := map[string]int{}
	extra := template.FuncMap{
		"toToml":        toTOML,
		"mustToToml":    mustToTOML,
		"fromToml":      fromTOML,
		"toYaml":        toYAML,
		"mustToYaml":    mustToYAML,
		"fromYaml":      fromYAML,
		"fromYamlArray": fromYAMLArray,
		"toJson":        toJSON,
		"mustToJson":    mustToJSON,
		"fromJson":      fromJSON,
		"fromJsonArray": fromJSONArray,
		"include":       includeFun(t, names),
		"tpl":           tplFun(t, names),
		"required": func(warn string, val interface{}) (interface{}, error) {
			if val == nil {
				return val, errors.New(warnWrap(warn))
			} else if s, ok := val.(string); ok && s == "" {
				return val, errors.New(warnWrap(warn))
			}
			return val, nil
		},
		"fail": func(msg string) (string, error) {
			return "", errors.New(warnWrap(msg))
		},
		"lookup": func(string, string, string, string) (map[string]interface{}, error) {
			return map[string]interface{}{}, nil
		},
		"getHostByName": func(string) string { return "" },
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

// sortTemplates orders template names as Helm parses them: by number of
// path segments (more first), then by name descending.
func sortTemplates(names []string) {
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca == cb {
			return a > b
		}
		return ca > cb
	})
}

func reformatExecError(filename string, err error) error {
	var ee template.ExecError
	if !errors.As(err, &ee) {
		return err
	}
	tokens := strings.SplitN(err.Error(), ": ", 3)
	if len(tokens) != 3 {
		return fmt.Errorf("execution error in (%s): %w", filename, err)
	}
	if parts := warnRegex.FindStringSubmatch(tokens[2]); len(parts) >= 2 {
		return fmt.Errorf("execution error at (%s): %s", tokens[1], parts[1])
	}
	return err
}

func cleanupParseError(filename string, err error) error {
	tokens := strings.Split(err.Error(), ": ")
	if len(tokens) == 1 {
		return fmt.Errorf("parse error in (%s): %w", filename, err)
	}
	return fmt.Errorf("parse error at (%s): %s", tokens[1], tokens[len(tokens)-1])
}

func render(c *chart, top Values) (out map[string]string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rendering template failed: %v", r)
		}
	}()
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	t.Funcs(funcMap(t))
	keys := make([]string, 0, len(c.templates))
	for k := range c.templates {
		keys = append(keys, k)
	}
	sortTemplates(keys)
	for _, name := range keys {
		if _, err := t.New(name).Parse(c.templates[name]); err != nil {
			return nil, cleanupParseError(name, err)
		}
	}
	out = map[string]string{}
	for _, name := range keys {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		top["Template"] = Values{"Name": name, "BasePath": path.Join(c.meta.Name, "templates")}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, reformatExecError(name, err)
		}
		out[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// ------------------------------------------------------------- manifests

var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret",
	"SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
	"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
	"ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role",
	"RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
	"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
	"StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
	"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}

var manifestSep = regexp.MustCompile(`(?m)^---[ \t]*`)

type manifest struct {
	source, content, kind string
}

func splitManifests(files map[string]string) ([]manifest, error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var out []manifest
	for _, p := range paths {
		content := files[p]
		if strings.HasPrefix(path.Base(p), "_") || strings.TrimSpace(content) == "" {
			continue
		}
		for _, d := range manifestSep.Split(strings.TrimLeftFunc(content, unicode.IsSpace), -1) {
			if strings.TrimSpace(d) == "" {
				continue
			}
			d = strings.TrimLeftFunc(d, unicode.IsSpace)
			var head struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(d), &head); err != nil {
				return nil, fmt.Errorf("YAML parse error on %s: %w", p, err)
			}
			out = append(out, manifest{source: p, content: d, kind: head.Kind})
		}
	}
	order := map[string]int{}
	for i, k := range installOrder {
		order[k] = i
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, aok := order[out[i].kind]
		b, bok := order[out[j].kind]
		switch {
		case !aok && !bok:
			return out[i].kind < out[j].kind
		case !aok:
			return false
		case !bok:
			return true
		}
		return a < b
	})
	return out, nil
}

// ------------------------------------------------------------------ main

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func run() error {
	var valueFiles, apiVersions multiFlag
	name := flag.String("name", "release-name", "release name (.Release.Name)")
	namespace := flag.String("namespace", "default", "release namespace (.Release.Namespace)")
	kubeVersion := flag.String("kube-version", "v1.35.0", "Kubernetes version for .Capabilities.KubeVersion")
	notesOut := flag.String("notes-out", "", "write the rendered NOTES.txt to this file")
	flag.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	flag.Var(&apiVersions, "api-versions", "extra API versions for .Capabilities.APIVersions (repeatable, comma-separated)")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("usage: helm-render [flags] CHART_DIR")
	}
	c, err := loadChart(flag.Arg(0))
	if err != nil {
		return err
	}

	user := map[string]interface{}{}
	for _, f := range valueFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		cur, err := loadValues(raw)
		if err != nil {
			return fmt.Errorf("failed to parse %s: %w", f, err)
		}
		user = mergeMaps(user, cur)
	}
	vals := coalesceValues(user, c.values)
	if c.schema != nil {
		if err := validateSchema(c.meta.Name, vals, c.schema); err != nil {
			return err
		}
	}

	m := kubeVersionRe.FindStringSubmatch(*kubeVersion)
	if m == nil {
		return fmt.Errorf("invalid --kube-version %q", *kubeVersion)
	}
	kv := *kubeVersion
	if !strings.HasPrefix(kv, "v") {
		kv = "v" + kv
	}
	if c.meta.KubeVersion != "" {
		// Helm's check of Chart.yaml's kubeVersion against the target.
		constraint, err := semver.NewConstraint(c.meta.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion %q: %w", c.meta.KubeVersion, err)
		}
		v, err := semver.NewVersion(kv)
		if err != nil {
			return fmt.Errorf("invalid --kube-version %q: %w", kv, err)
		}
		if !constraint.Check(v) {
			return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c.meta.KubeVersion, kv)
		}
	}
	apis := append(VersionSet{}, builtinAPIVersions...)
	for _, a := range apiVersions {
		for _, s := range strings.Split(a, ",") {
			if s = strings.TrimSpace(s); s != "" {
				apis = append(apis, s)
			}
		}
	}
	top := Values{
		"Chart":        structToMap(&c.meta),
		"Files":        c.files,
		"Capabilities": &Capabilities{KubeVersion: KubeVersion{Version: kv, Major: m[1], Minor: m[2]}, APIVersions: apis, HelmVersion: HelmVersion{Version: "v3-compatible (helm-render)"}},
		"Release": map[string]interface{}{
			"Name": *name, "Namespace": *namespace, "IsUpgrade": false,
			"IsInstall": true, "Revision": 1, "Service": "Helm",
		},
		"Values":    Values(vals),
		"Subcharts": map[string]interface{}{},
	}
	top["Chart"].(map[string]interface{})["IsRoot"] = true

	files, err := render(c, top)
	if err != nil {
		return err
	}
	notesName := path.Join(c.meta.Name, "templates", "NOTES.txt")
	for k, v := range files {
		if strings.HasSuffix(k, "NOTES.txt") {
			if k == notesName && *notesOut != "" {
				if err := os.WriteFile(*notesOut, []byte(v), 0o644); err != nil {
					return err
				}
			}
			delete(files, k)
		}
	}
	ms, err := splitManifests(files)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	for _, mf := range ms {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", mf.source, mf.content)
	}
	return w.Flush()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s\n", err)
		os.Exit(1)
	}
}
