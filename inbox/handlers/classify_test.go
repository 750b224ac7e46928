package handlers

import "errors"

func isPermanent(err error) bool {
	var pe *permanentError
	return errors.As(err, &pe)
}
